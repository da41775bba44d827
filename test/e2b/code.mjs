// Drives a code-interpreter sandbox (corral env install code-interpreter) through Corral's E2B
// gateway with the unmodified @e2b/code-interpreter SDK: runCode keeps state across calls,
// returns logs, errors with the exception's name, matplotlib figures as png results, separate
// contexts with separate state (create, list, restart, remove), a timeout that leaves the
// kernel usable, an unknown context. Run by internal/e2e/code_test.go with the variables of
// sandbox.mjs; prints one JSON line per step and, last, {"ok":true,...}.
import { Sandbox } from '@e2b/code-interpreter'
import { check, finish, refused, step } from './lib.mjs'

const template = process.env.E2B_TEMPLATE
const run = process.env.E2B_RUN
await finish(async () => {
  const created = Date.now()
  const sbx = await Sandbox.create(template, { metadata: { run } })
  await step('first-run', async () => {
    const ex = await sbx.runCode('x = 40\nx + 2')
    check(ex.text === '42' && !ex.error, JSON.stringify(ex.toJSON()))
    return { text: ex.text, ms_since_create: Date.now() - created }
  })
  await step('state-kept', async () => {
    const ex = await sbx.runCode('x += 1\nx')
    check(ex.text === '41', JSON.stringify(ex.toJSON()))
    return ex.text
  })
  await step('logs', async () => {
    const seen = []
    const ex = await sbx.runCode('import sys\nprint("out")\nprint("err", file=sys.stderr)', { onStdout: (m) => seen.push(m.line) })
    check(ex.logs.stdout.join('') === 'out\n' && ex.logs.stderr.join('') === 'err\n', JSON.stringify(ex.logs))
    check(seen.join('') === 'out\n', `onStdout saw ${JSON.stringify(seen)}`)
    return ex.logs
  })
  await step('error', async () => {
    const ex = await sbx.runCode('1 / 0')
    check(ex.error && ex.error.name === 'ZeroDivisionError' && ex.error.value === 'division by zero', JSON.stringify(ex.error))
    check(ex.error.traceback.includes('ZeroDivisionError'), ex.error.traceback)
    return { name: ex.error.name, value: ex.error.value }
  })
  await step('matplotlib-png', async () => {
    const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
    const png = ex.results.find((r) => r.png)
    check(png, `no png result: ${JSON.stringify(ex.toJSON()).slice(0, 500)}`)
    const bytes = Buffer.from(png.png, 'base64')
    check(bytes.subarray(1, 4).toString() === 'PNG' && bytes.length > 1000, `not a PNG: ${bytes.length} bytes`)
    return { formats: png.formats(), bytes: bytes.length }
  })
  await step('rich-results', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2]})')
    check(ex.results[0].html && ex.results[0].html.includes('<table'), JSON.stringify(ex.toJSON()).slice(0, 500))
    return ex.results[0].formats()
  })
  await step('contexts', async () => {
    const a = await sbx.createCodeContext()
    const b = await sbx.createCodeContext({ cwd: '/tmp' })
    await sbx.runCode('v = "a"', { context: a })
    await sbx.runCode('v = "b"', { context: b })
    const va = await sbx.runCode('v', { context: a })
    const vb = await sbx.runCode('import os\n(v, os.getcwd())', { context: b })
    check(va.text === "'a'" && vb.text === "('b', '/tmp')", `${va.text} ${vb.text}`)
    const none = await sbx.runCode('v')
    check(none.error && none.error.name === 'NameError', `the default context sees v: ${JSON.stringify(none.toJSON())}`)
    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    check(ids.includes(a.id) && ids.includes(b.id), JSON.stringify(ids))
    await sbx.restartCodeContext(a)
    const gone = await sbx.runCode('v', { context: a })
    check(gone.error && gone.error.name === 'NameError', `v after restart: ${JSON.stringify(gone.toJSON())}`)
    await sbx.removeCodeContext(b)
    const e = await refused(() => sbx.runCode('1', { context: b }))
    check(e.constructor.name === 'NotFoundError', `${e.constructor.name}: ${e.message}`)
    return { contexts: ids.length }
  })
  await step('timeout', async () => {
    const started = Date.now()
    const e = await refused(() => sbx.runCode('import time\nwhile True: time.sleep(0.1)', { timeoutMs: 1500 }))
    check(e.constructor.name === 'TimeoutError', `${e.constructor.name}: ${e.message}`)
    check(Date.now() - started < 10_000, `took ${Date.now() - started} ms`)
    // The client's timeout interrupted the kernel, not the sandbox: state kept, kernel usable.
    const ex = await sbx.runCode('x')
    check(ex.text === '41', `after the timeout: ${JSON.stringify(ex.toJSON())}`)
    return { error: e.constructor.name }
  })
  await sbx.kill()
  return { sandbox: sbx.sandboxId }
})
