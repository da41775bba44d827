// What the test/e2b scripts share: named steps that print one JSON line each, expectations that
// fail naming the step, and calls expected to fail.

let current = ''

// step runs f as the step called name and prints its result.
export async function step(name, f) {
  current = name
  const result = await f()
  console.log(JSON.stringify({ step: name, result }))
  return result
}

// check fails the current step with what went wrong unless cond holds.
export function check(cond, what) {
  if (!cond) throw new Error(`${current}: ${what}`)
}

// refused returns the error f fails with, and fails the step if f succeeds.
export async function refused(f) {
  try {
    await f()
  } catch (e) {
    return e
  }
  throw new Error(`${current}: the call succeeded, want an error`)
}

// finish prints the last line: {"ok":true, ...result}, or {"ok":false, ...} and exit status 1.
export async function finish(main) {
  try {
    console.log(JSON.stringify({ ok: true, ...(await main()) }))
  } catch (e) {
    // The cause says what a bare "TypeError: terminated" or "fetch failed" hides (the socket's
    // error), and the stack which call it was.
    const cause = e.cause ? `${e.cause.constructor.name}: ${e.cause.message}${e.cause.code ? ` (${e.cause.code})` : ''}` : undefined
    console.log(JSON.stringify({ ok: false, step: current, error: e.constructor.name, message: e.message, cause, stack: e.stack }))
    process.exit(1)
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
