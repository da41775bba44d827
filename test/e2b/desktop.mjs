// Drives a desktop sandbox (corral env install desktop) through Corral's E2B gateway with the
// unmodified @e2b/desktop SDK: Desktop.create starts (or finds) Xvfb and XFCE, then screenshot
// (a PNG of the screen's size), getScreenSize, moveMouse and getCursorPosition, leftClick, write
// and press (into a terminal, read back from a file), and stream.start() with getUrl() (noVNC on
// port 6080), whose URL the Go test opens in Chromium. Run by internal/e2e/desktop_test.go with
// the variables of sandbox.mjs; prints one JSON line per step and, last,
// {"ok":true,"sandbox":ID,"url":URL}.
import { Sandbox } from '@e2b/desktop'
import { check, finish, sleep, step } from './lib.mjs'

const template = process.env.E2B_TEMPLATE
const run = process.env.E2B_RUN
await finish(async () => {
  const created = Date.now()
  const desktop = await Sandbox.create(template, { metadata: { run } })
  const size = await step('screenshot', async () => {
    const png = Buffer.from(await desktop.screenshot())
    check(png.subarray(1, 4).toString() === 'PNG', `not a PNG: ${png.length} bytes`)
    const width = png.readUInt32BE(16), height = png.readUInt32BE(20)
    return { width, height, bytes: png.length, ms_since_create: Date.now() - created }
  })
  await step('screen-size', async () => {
    const s = await desktop.getScreenSize()
    check(s.width === size.width && s.height === size.height, `getScreenSize ${JSON.stringify(s)}, the screenshot ${size.width}x${size.height}`)
    return s
  })
  await step('mouse', async () => {
    await desktop.moveMouse(321, 234)
    const at = await desktop.getCursorPosition()
    check(at.x === 321 && at.y === 234, `the cursor is at ${JSON.stringify(at)}, want 321,234`)
    await desktop.leftClick(500, 400)
    const after = await desktop.getCursorPosition()
    check(after.x === 500 && after.y === 400, `after leftClick(500, 400) the cursor is at ${JSON.stringify(after)}`)
    return after
  })
  await step('write-press', async () => {
    // A terminal whose shell writes what is typed to a file: write types, press sends Enter.
    await desktop.commands.run(`xfce4-terminal --disable-server --title typed-here -x sh -c 'read line; echo "$line" > /tmp/typed'`, { background: true, envs: { DISPLAY: ':0' } })
    const found = await desktop.commands.run('xdotool search --sync --name typed-here windowactivate --sync', { envs: { DISPLAY: ':0' }, timeoutMs: 30000 })
    check(found.exitCode === 0, 'no terminal window')
    await desktop.write("hello from e2b's desktop")
    await desktop.press('enter')
    let got = ''
    for (let i = 0; i < 100 && got === ''; i++) {
      got = (await desktop.commands.run('cat /tmp/typed 2>/dev/null || true')).stdout.trim()
      if (got === '') await sleep(100)
    }
    check(got === "hello from e2b's desktop", `the terminal read ${JSON.stringify(got)}`)
    return got
  })
  const url = await step('stream', async () => {
    await desktop.stream.start()
    const u = desktop.stream.getUrl()
    check(u.includes('6080-') && u.includes('/vnc.html') && u.includes('autoconnect=true'), u)
    return u
  })
  return { sandbox: desktop.sandboxId, url }
})
// The stream's noVNC command stays attached (the SDK keeps its handle): done, without it.
process.exit(0)
