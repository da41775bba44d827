// Drives Corral's E2B template builds with E2B's unmodified CLI, `e2b template create NAME`
// (@e2b/cli, pinned in package.json), which reads e2b.Dockerfile and builds it through the SDK's
// template builder (fromDockerfile); then a sandbox of the template, made with the SDK, sees
// what the Dockerfile did; and a Dockerfile with a CMD (a start command, which Corral does not
// run) fails the CLI with the gateway's reason. Run by internal/e2e/e2b_template_test.go with
// E2B_API_URL, E2B_API_KEY, E2B_TEMPLATE (the base layer) and E2B_RUN set; prints one JSON line
// per step and, last, {"ok":true,"sandbox":ID}.
import { Sandbox } from 'e2b'
import { spawnSync } from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { check, finish, step } from './lib.mjs'

const base = process.env.E2B_TEMPLATE
const run = process.env.E2B_RUN
const here = path.dirname(fileURLToPath(import.meta.url))
const cli = path.join(here, 'node_modules', '@e2b', 'cli', 'dist', 'index.js')

// project writes a directory with e2b.Dockerfile and data.txt, and returns it.
function project(dir, dockerfile) {
  const root = path.join(here, dir)
  fs.mkdirSync(root, { recursive: true })
  fs.writeFileSync(path.join(root, 'e2b.Dockerfile'), dockerfile)
  fs.writeFileSync(path.join(root, 'data.txt'), `data ${run}\n`)
  return root
}

// e2b runs the CLI with args and returns its exit status and output.
function e2b(...args) {
  const r = spawnSync(process.execPath, [cli, ...args], { env: process.env, encoding: 'utf8', timeout: 300_000 })
  return { status: r.status, out: (r.stdout ?? '') + (r.stderr ?? '') }
}

await finish(async () => {
  const name = `tpl-cli-${run}`
  const good = project('cli-good', [
    `FROM ${base}`,
    'USER root',
    'WORKDIR /srv',
    'ENV FROM_CLI=yes',
    'COPY data.txt ./data.txt',
    'RUN echo cli-made > /srv/cli.txt',
    '',
  ].join('\n'))

  await step('cli-template-create', async () => {
    const r = e2b('template', 'create', name, '-p', good)
    check(r.status === 0, `e2b template create exited ${r.status}:\n${r.out}`)
    return { status: r.status }
  })

  let sbx
  await step('cli-sandbox', async () => {
    sbx = await Sandbox.create(name, { timeoutMs: 60_000, metadata: { run } })
    const r = await sbx.commands.run('pwd; cat data.txt; cat cli.txt; echo "$FROM_CLI"; id -u')
    check(r.stdout === `/srv\ndata ${run}\ncli-made\nyes\n0\n`, `stdout ${JSON.stringify(r.stdout)}`)
    return { sandboxId: sbx.sandboxId }
  })

  await step('cli-refuse-cmd', async () => {
    const bad = project('cli-bad', `FROM ${base}\nUSER root\nCMD ["sleep", "infinity"]\n`)
    const r = e2b('template', 'create', `${name}-bad`, '-p', bad)
    check(r.status !== 0 && /startCmd/.test(r.out), `exit ${r.status}, want a failure naming startCmd:\n${r.out}`)
    return { status: r.status }
  })

  await sbx.kill()
  return { sandbox: sbx.sandboxId }
})
