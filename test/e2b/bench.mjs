// Times the e2b SDK against Corral's E2B gateway: Sandbox.create to the first commands.run
// result, and the commands.run('true') round trip. Run by `corral bench e2b` with E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY, E2B_TEMPLATE, BENCH_CREATES and BENCH_RUNS set; prints one JSON
// line {"create_to_first_run_ms": [...], "run_true_ms": [...]}.
import { Sandbox } from 'e2b'

const template = process.env.E2B_TEMPLATE
const creates = Number(process.env.BENCH_CREATES || 10)
const runs = Number(process.env.BENCH_RUNS || 100)
const out = { create_to_first_run_ms: [], run_true_ms: [] }

for (let i = 0; i < creates; i++) {
  const t0 = performance.now()
  const sbx = await Sandbox.create(template, { metadata: { bench: 'e2b' } })
  await sbx.commands.run('true')
  out.create_to_first_run_ms.push(performance.now() - t0)
  if (i === 0) {
    for (let j = 0; j < runs; j++) {
      const t1 = performance.now()
      await sbx.commands.run('true')
      out.run_true_ms.push(performance.now() - t1)
    }
  }
  await sbx.kill()
}
console.log(JSON.stringify(out))
