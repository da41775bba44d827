// Drives the in-sandbox surface of Corral's E2B gateway with the unmodified e2b SDK: commands
// (output, exit codes, errors, timeouts), background commands with stdin and kill, files
// (write, read, list, rename, remove, watch), pause and resume with state kept, network options,
// ports, kill. Run by internal/e2e/e2b_test.go with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY,
// E2B_TEMPLATE, E2B_RUN and E2B_DOMAIN set; prints one JSON line per step and, last,
// {"ok":true,...}. Any failed expectation exits 1 naming the step.
import { Sandbox, CommandExitError } from 'e2b'
import { check, finish, refused, sleep, step } from './lib.mjs'

const template = process.env.E2B_TEMPLATE
const run = process.env.E2B_RUN
await finish(async () => {
  const sbx = await Sandbox.create(template, { metadata: { run }, envs: { GREETING: 'hi' } })

  await step('run', async () => {
    const r = await sbx.commands.run('echo $GREETING; echo oops >&2')
    check(r.exitCode === 0 && r.stdout === 'hi\n' && r.stderr === 'oops\n', JSON.stringify(r))
    return r
  })
  await step('run-exit-code', async () => {
    const e = await refused(() => sbx.commands.run('echo partial; exit 3'))
    check(e instanceof CommandExitError && e.exitCode === 3 && e.stdout === 'partial\n', `${e.constructor.name} ${e.message} ${e.exitCode}`)
    return { exitCode: e.exitCode, message: e.message }
  })
  await step('run-cwd-envs', async () => {
    const r = await sbx.commands.run('pwd; echo $X', { cwd: '/tmp', envs: { X: 'y' } })
    check(r.stdout === '/tmp\ny\n', JSON.stringify(r.stdout))
    return r.stdout
  })
  await step('run-timeout', async () => {
    const started = Date.now()
    const e = await refused(() => sbx.commands.run('sleep 30', { timeoutMs: 1000 }))
    check(Date.now() - started < 10_000, `took ${Date.now() - started} ms`)
    return { error: e.constructor.name }
  })
  await step('background-stdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    check(h.pid > 0, `pid ${h.pid}`)
    await sbx.commands.sendStdin(h.pid, 'typed\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    check(r.exitCode === 0 && r.stdout === 'typed\n', JSON.stringify(r))
    return r.stdout
  })
  await step('background-kill', async () => {
    const h = await sbx.commands.run('sleep 120', { background: true, timeoutMs: 0 })
    const listed = await sbx.commands.list()
    check(listed.some((p) => p.pid === h.pid), `list: ${JSON.stringify(listed)}`)
    check((await sbx.commands.kill(h.pid)) === true, 'kill did not answer true')
    await refused(() => h.wait())
    check((await sbx.commands.kill(h.pid)) === false, 'a second kill did not answer false')
    return { pid: h.pid }
  })

  await step('files', async () => {
    await sbx.files.write('/tmp/t/a.txt', 'hello')
    check((await sbx.files.read('/tmp/t/a.txt')) === 'hello', 'read back')
    const names = (await sbx.files.list('/tmp/t')).map((e) => e.name)
    check(names.includes('a.txt'), `list: ${names}`)
    check((await sbx.files.exists('/tmp/t/a.txt')) === true, 'exists')
    check((await sbx.files.makeDir('/tmp/t/d')) === true, 'makeDir')
    check((await sbx.files.makeDir('/tmp/t/d')) === false, 'makeDir twice')
    await sbx.files.rename('/tmp/t/a.txt', '/tmp/t/b.txt')
    check((await sbx.files.exists('/tmp/t/a.txt')) === false, 'renamed away')
    await sbx.files.remove('/tmp/t/b.txt')
    check((await sbx.files.exists('/tmp/t/b.txt')) === false, 'removed')
    await sbx.files.write([{ path: '/tmp/t/m1', data: '1' }, { path: '/tmp/t/m2', data: '2' }])
    check((await sbx.files.read('/tmp/t/m2')) === '2', 'multi write')
    return names
  })
  await step('watch', async () => {
    await sbx.files.makeDir('/tmp/w')
    const events = []
    const w = await sbx.files.watchDir('/tmp/w', (e) => events.push(e), { recursive: true })
    await sbx.commands.run('echo x > /tmp/w/f; mkdir /tmp/w/sub; sleep 0.2; echo y > /tmp/w/sub/g; rm /tmp/w/f')
    await sleep(1000)
    await w.stop()
    const seen = events.map((e) => `${e.type}:${e.name}`)
    for (const want of ['create:f', 'create:sub', 'create:sub/g', 'remove:f']) {
      check(seen.includes(want), `no ${want} in ${seen}`)
    }
    return seen
  })

  await step('pty', async () => {
    let seen = ''
    const dec = new TextDecoder()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { seen += dec.decode(d) }, timeoutMs: 0 })
    await sbx.pty.resize(h.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size; echo marker-$((6*7))\n'))
    for (let i = 0; i < 50 && !seen.includes('marker-42'); i++) await sleep(100)
    check(seen.includes('marker-42'), `pty output: ${JSON.stringify(seen.slice(-200))}`)
    check(seen.includes('40 120'), `the resized terminal: ${JSON.stringify(seen.slice(-200))}`)
    check((await sbx.pty.kill(h.pid)) === true, 'pty kill')
    return { pid: h.pid }
  })

  await step('pause-resume-keeps-state', async () => {
    await sbx.files.write('/tmp/kept', 'still here')
    const h = await sbx.commands.run('sleep 300', { background: true, timeoutMs: 0 })
    check((await sbx.pause()) === true, 'pause')
    const back = await Sandbox.connect(sbx.sandboxId)
    check((await back.files.read('/tmp/kept')) === 'still here', 'file after resume')
    const listed = await back.commands.list()
    check(listed.some((p) => p.pid === h.pid), `process after resume: ${JSON.stringify(listed)}`)
    await back.commands.kill(h.pid)
    return { pid: h.pid }
  })

  await step('is-running', async () => {
    check((await sbx.isRunning()) === true, 'isRunning')
    return true
  })

  let netSandbox
  await step('network-options', async () => {
    const s = await Sandbox.create(template, { metadata: { run, role: 'net' }, allowInternetAccess: false, network: { allowOut: ['198.51.100.7'] } })
    netSandbox = s.sandboxId
    await s.kill()
    return { sandbox: netSandbox }
  })

  await step('kill', async () => {
    check((await sbx.kill()) === true, 'kill')
    check((await sbx.isRunning()) === false, 'isRunning after kill')
    return true
  })
  return { sandbox: sbx.sandboxId, network: netSandbox }
})
