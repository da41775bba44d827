// Drives Corral's E2B control plane with the unmodified e2b SDK: create, options Corral refuses,
// info, timeout, list by metadata, pause, connect (resume), kill, and errors as the SDK expects
// them. Run by internal/e2e/e2b_test.go with E2B_API_URL, E2B_API_KEY, E2B_TEMPLATE and
// E2B_RUN set; prints one JSON line per step and, last, {"ok":true,"sandbox":ID}. Any failed
// expectation exits 1 naming the step.
import { Sandbox } from 'e2b'
import { check, finish, refused, step } from './lib.mjs'

const template = process.env.E2B_TEMPLATE
const run = process.env.E2B_RUN
await finish(async () => {
  let sbx
  await step('create', async () => {
    sbx = await Sandbox.create(template, { timeoutMs: 120_000, metadata: { run, role: 'first' }, envs: { GREETING: 'hi' } })
    check(sbx.sandboxId.startsWith('sb-'), `sandbox ID ${sbx.sandboxId}`)
    return { sandboxId: sbx.sandboxId, envdVersion: sbx.envdApi?.version }
  })

  await step('refuse-autopause', async () => {
    const e = await refused(() => Sandbox.create(template, { lifecycle: { onTimeout: 'pause' } }))
    check(/autoPause/.test(e.message), `message ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })
  await step('refuse-unknown-template', async () => {
    const e = await refused(() => Sandbox.create('no-such-template'))
    check(/no-such-template/.test(e.message), `message ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })
  await step('refuse-bad-key', async () => {
    const e = await refused(() => Sandbox.create(template, { apiKey: 'crl_' + 'x'.repeat(43) }))
    check(e.constructor.name === 'AuthenticationError', `error ${e.constructor.name}: ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })

  await step('info', async () => {
    const info = await sbx.getInfo()
    check(info.sandboxId === sbx.sandboxId, `id ${info.sandboxId}`)
    check(info.metadata.run === run && info.metadata.role === 'first', `metadata ${JSON.stringify(info.metadata)}`)
    check(info.state === 'running', `state ${info.state}`)
    const left = (new Date(info.endAt) - Date.now()) / 1000
    check(left > 60 && left <= 121, `ends in ${left}s, want about 120`)
    return { state: info.state, left }
  })

  await step('set-timeout', async () => {
    await sbx.setTimeout(600_000)
    const left = (new Date((await sbx.getInfo()).endAt) - Date.now()) / 1000
    check(left > 540 && left <= 601, `ends in ${left}s after setTimeout(600s)`)
    return { left }
  })

  await step('list-by-metadata', async () => {
    const other = await Sandbox.create(template, { metadata: { run, role: 'second' } })
    const page = await Sandbox.list({ query: { metadata: { run, role: 'first' } } }).nextItems()
    const all = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
    await other.kill()
    check(page.length === 1 && page[0].sandboxId === sbx.sandboxId, `first: ${JSON.stringify(page.map((s) => s.sandboxId))}`)
    check(all.length === 2, `run: ${all.length} sandboxes, want 2`)
    return { first: page.length, all: all.length }
  })

  await step('pause', async () => {
    check((await sbx.pause()) === true, 'pause did not answer true')
    const info = await sbx.getInfo()
    check(info.state === 'paused', `state ${info.state}`)
    const paused = await Sandbox.list({ query: { metadata: { run }, state: ['paused'] } }).nextItems()
    check(paused.length === 1, `paused list: ${paused.length}`)
    return { state: info.state }
  })

  await step('connect-resumes', async () => {
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    check(again.sandboxId === sbx.sandboxId, `id ${again.sandboxId}`)
    const info = await again.getInfo()
    check(info.state === 'running', `state ${info.state}`)
    const host = again.getHost(8080)
    check(host === `8080-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`, `getHost(8080) = ${host}`)
    return { state: info.state, host }
  })

  await step('metrics', async () => {
    // The node samples every few seconds (corral up --sample-interval); wait for one.
    let m = []
    for (let i = 0; i < 150 && m.length === 0; i++) {
      m = await sbx.getMetrics()
      if (m.length === 0) await new Promise((r) => setTimeout(r, 200))
    }
    check(m.length > 0, 'no metrics within 30s')
    const s = m[m.length - 1]
    check(s.timestamp instanceof Date && s.memUsed > 0 && s.memTotal >= s.memUsed && s.cpuCount >= 1 && s.diskTotal > 0,
      `metric ${JSON.stringify(s)}`)
    const later = await sbx.getMetrics({ start: new Date(s.timestamp.getTime() + 1000) })
    check(later.every((x) => x.timestamp > s.timestamp), `metrics after start: ${JSON.stringify(later)}`)
  })

  await step('kill', async () => {
    check((await sbx.kill()) === true, 'kill did not answer true')
    check((await Sandbox.kill(sbx.sandboxId)) === false, 'a second kill did not answer false')
    const e = await refused(() => Sandbox.getInfo(sbx.sandboxId))
    check(e.constructor.name === 'SandboxNotFoundError' || /not found/i.test(e.message), `getInfo after kill: ${e.constructor.name} ${e.message}`)
    return { error: e.constructor.name, message: e.message }
  })

  return { sandbox: sbx.sandboxId }
})
