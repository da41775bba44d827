// Drives Corral's E2B template builds with the unmodified e2b SDK's template builder: a template
// from a Corral layer (fromImage) with an env var, a workdir, a runCmd that writes a file and
// a copy of a local file, built with Template.build into environment tpl-<run>; a sandbox made
// from it sees all four; a rebuild finds every step cached; a template on top of it
// (fromTemplate); Template.exists; and the refusals: a copy source outside the file context
// (the SDK's own check), an image that is no layer here, an unknown template, a failing runCmd,
// a start command. Run by internal/e2e/e2b_template_test.go with E2B_API_URL, E2B_API_KEY,
// E2B_TEMPLATE (the base layer) and E2B_RUN set; prints one JSON line per step and, last,
// {"ok":true,"sandbox":ID}.
import { Sandbox, Template, waitForTimeout } from 'e2b'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { check, finish, refused, step } from './lib.mjs'

const base = process.env.E2B_TEMPLATE
const run = process.env.E2B_RUN
const name = `tpl-${run}`
const ctx = path.join(path.dirname(fileURLToPath(import.meta.url)), 'tplctx')
fs.mkdirSync(path.join(ctx, 'sub'), { recursive: true })
fs.writeFileSync(path.join(ctx, 'hello.txt'), `hello from the file context ${run}\n`)
fs.writeFileSync(path.join(ctx, 'sub', 'nested.txt'), 'nested\n')

// build runs Template.build and returns its answer and the log lines it reported.
async function build(tpl, tplName) {
  const logs = []
  const info = await Template.build(tpl, tplName, { onBuildLogs: (e) => logs.push(e.message) })
  return { info, logs }
}

function template() {
  return Template({ fileContextPath: ctx })
    .fromImage(base)
    .setEnvs({ GREETING: 'hello "e2b" world', RUN_ID: run })
    .setWorkdir('/app')
    .runCmd('echo built-by-runcmd > /app/made.txt && echo log-line-from-runcmd')
    .copy('hello.txt', '/app/hello.txt')
    .copy('sub', '/app/sub/')
}

await finish(async () => {
  let sbx
  let cold
  await step('build', async () => {
    const t0 = Date.now()
    const { info, logs } = await build(template(), name)
    cold = Date.now() - t0
    check(info.templateId === name, `templateId ${info.templateId}`)
    check(logs.some((l) => l.includes('log-line-from-runcmd')), `no runCmd output in the logs: ${JSON.stringify(logs)}`)
    return { templateId: info.templateId, buildId: info.buildId, logLines: logs.length, ms: cold }
  })

  await step('exists', async () => {
    check(await Template.exists(name), `Template.exists(${name}) is false`)
    check(!(await Template.exists(`no-such-${run}`)), 'Template.exists of an unknown name is true')
    return {}
  })

  await step('sandbox', async () => {
    sbx = await Sandbox.create(name, { timeoutMs: 120_000, metadata: { run } })
    const r = await sbx.commands.run('pwd; cat made.txt; cat hello.txt; cat sub/nested.txt; echo "$GREETING|$RUN_ID"')
    const lines = r.stdout.trim().split('\n')
    check(lines[0] === '/app', `workdir: ${lines[0]}`)
    check(lines[1] === 'built-by-runcmd', `runCmd's file: ${lines[1]}`)
    check(lines[2] === `hello from the file context ${run}`, `copied file: ${lines[2]}`)
    check(lines[3] === 'nested', `copied directory: ${lines[3]}`)
    check(lines[4] === `hello "e2b" world|${run}`, `env: ${lines[4]}`)
    return { sandboxId: sbx.sandboxId, stdout: r.stdout }
  })

  await step('rebuild-cached', async () => {
    const t0 = Date.now()
    const { logs } = await build(template(), name)
    const ms = Date.now() - t0
    const cached = logs.filter((l) => l.includes('CACHED'))
    check(cached.length === 3, `want the runCmd and both copies CACHED, got ${JSON.stringify(logs)}`)
    return { cached, ms, coldMs: cold }
  })

  await step('from-template', async () => {
    const child = `${name}-child`
    await build(Template().fromTemplate(name).runCmd('echo child >> made.txt'), child)
    const s = await Sandbox.create(child, { timeoutMs: 60_000, metadata: { run } })
    const r = await s.commands.run('cat made.txt')
    await s.kill()
    check(r.stdout === 'built-by-runcmd\nchild\n', `made.txt: ${JSON.stringify(r.stdout)}`)
    return {}
  })

  await step('refuse-copy-outside', async () => {
    const e = await refused(async () => Template({ fileContextPath: ctx }).fromImage(base).copy('../outside.txt', '/x'))
    check(/escapes the context/.test(e.message), `message ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })

  await step('refuse-unknown-image', async () => {
    const e = await refused(() => build(Template().fromImage('debian:bookworm').runCmd('true'), `${name}-bad`))
    check(e.constructor.name === 'BuildError' && /fromImage/.test(e.message) && /corral layer import/.test(e.message), `${e.constructor.name}: ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })

  await step('refuse-unknown-template', async () => {
    const e = await refused(() => build(Template().fromTemplate(`no-such-${run}`).runCmd('true'), `${name}-bad`))
    check(e.constructor.name === 'BuildError' && /fromTemplate/.test(e.message) && /not found/.test(e.message), `${e.constructor.name}: ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })

  await step('refuse-failing-runcmd', async () => {
    const logs = []
    const tpl = Template().fromImage(base).runCmd('echo about-to-fail; exit 3')
    const e = await refused(() => Template.build(tpl, `${name}-bad`, { onBuildLogs: (l) => logs.push(l.message) }))
    check(e.constructor.name === 'BuildError' && /^steps\[0\] \(RUN .*exit code 3/.test(e.message), `${e.constructor.name}: ${e.message}`)
    check(logs.some((l) => l.includes('about-to-fail')), `no output of the failing command in the logs: ${JSON.stringify(logs)}`)
    return { error: e.constructor.name, message: e.message }
  })

  await step('refuse-start-cmd', async () => {
    const tpl = Template().fromImage(base).setStartCmd('sleep infinity', waitForTimeout(1000))
    const e = await refused(() => build(tpl, `${name}-bad`))
    check(e.constructor.name === 'BuildError' && /startCmd/.test(e.message), `${e.constructor.name}: ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })

  await sbx.kill()
  return { sandbox: sbx.sandboxId }
})
