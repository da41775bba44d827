// Times the e2b SDK against Corral's E2B gateway: Sandbox.create to the first commands.run
// result, the commands.run('true') round trip, and Template.build of a template of an env var,
// a workdir, a runCmd and a copy, without the cache (cold) and unchanged (cached). Run by
// `corral bench e2b` with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_TEMPLATE,
// BENCH_CREATES, BENCH_RUNS and BENCH_BUILDS set (and BENCH_FLOOR_URL, an envd that answers at
// once); prints one JSON line {"create_to_first_run_ms": [...], "run_true_ms": [...],
// "run_true_floor_ms": [...], "build_cold_ms": [...], "build_cached_ms": [...]}.
import { Sandbox, Template } from 'e2b'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const template = process.env.E2B_TEMPLATE
const creates = Number(process.env.BENCH_CREATES || 10)
const runs = Number(process.env.BENCH_RUNS || 100)
const builds = Number(process.env.BENCH_BUILDS || 0)
const out = { create_to_first_run_ms: [], run_true_ms: [], run_true_floor_ms: [], build_cold_ms: [], build_cached_ms: [] }

for (let i = 0; i < creates; i++) {
  const t0 = performance.now()
  const sbx = await Sandbox.create(template, { metadata: { bench: 'e2b' } })
  await sbx.commands.run('true')
  out.create_to_first_run_ms.push(performance.now() - t0)
  if (i === 0) {
    // BENCH_FLOOR_URL: an envd that answers every command at once, sampled in turn.
    const floor = process.env.BENCH_FLOOR_URL
      ? await Sandbox.connect(sbx.sandboxId, { sandboxUrl: process.env.BENCH_FLOOR_URL }) : null
    for (let j = 0; j < runs; j++) {
      const t1 = performance.now()
      await sbx.commands.run('true')
      out.run_true_ms.push(performance.now() - t1)
      if (floor) {
        const t2 = performance.now()
        await floor.commands.run('true')
        out.run_true_floor_ms.push(performance.now() - t2)
      }
    }
  }
  await sbx.kill()
}
// The same steps as internal/bench's Dockerfile for Corral's own builds.
const ctx = path.join(path.dirname(fileURLToPath(import.meta.url)), 'benchctx')
fs.mkdirSync(ctx, { recursive: true })
fs.writeFileSync(path.join(ctx, 'hello.txt'), 'hello from the bench\n')
const tpl = () => Template({ fileContextPath: ctx }).fromImage(template)
  .setEnvs({ GREETING: 'hi' }).setWorkdir('/app').runCmd('echo made > /app/made.txt').copy('hello.txt', '/app/hello.txt')
for (const [key, skipCache] of [['build_cold_ms', true], ['build_cached_ms', false]]) {
  for (let i = 0; i < builds; i++) {
    const t0 = performance.now()
    await Template.build(tpl(), 'bench-e2b-build', { skipCache })
    out[key].push(performance.now() - t0)
  }
}
console.log(JSON.stringify(out))
