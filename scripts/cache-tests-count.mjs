// Counts the cache test suite's passes per kind (a test without one is required) for two
// result files side by side, lists sluice's failed required tests, and exits 1 when sluice
// passes fewer required tests than the floor.
//
//   node scripts/cache-tests-count.mjs SUITE sluice.json nginx.json FLOOR
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suiteDir, sluiceFile, nginxFile, floor] = process.argv.slice(2)
const index = pathToFileURL(path.join(suiteDir, 'tests', 'index.mjs'))
const { default: suites } = await import(index.href)
const results = [sluiceFile, nginxFile].map(f => JSON.parse(fs.readFileSync(f, 'utf8')))
const kinds = ['required', 'optimal', 'check']
const counts = Object.fromEntries(kinds.map(k => [k, { total: 0, passed: [0, 0] }]))
const failed = []
const notRun = []
for (const suite of suites) {
  for (const test of suite.tests) {
    const kind = test.kind || 'required'
    counts[kind].total++
    results.forEach((r, i) => { if (r[test.id] === true) counts[kind].passed[i]++ })
    const got = results[0][test.id]
    if (kind === 'required' && got !== true) {
      // Not run: a test for browsers' private caches (`browser_only`), not a shared one's.
      if (got === undefined) { notRun.push(test.id); continue }
      const why = Array.isArray(got) ? got.join(': ') : String(got)
      failed.push(`  ${suite.id}/${test.id}: ${test.name} -- ${why}`)
    }
  }
}
console.log('kind       tests  sluice  nginx')
for (const k of kinds) {
  const c = counts[k]
  console.log(`${k.padEnd(10)} ${String(c.total).padStart(5)}  ${String(c.passed[0]).padStart(6)}  ${String(c.passed[1]).padStart(5)}`)
}
console.log(`required tests not run against a shared cache (browser only): ${notRun.join(', ')}`)
console.log(`sluice's failed required tests (${failed.length}):`)
console.log(failed.join('\n'))
if (counts.required.passed[0] < Number(floor)) {
  console.log(`sluice passed ${counts.required.passed[0]} required tests, fewer than the floor ${floor}`)
  process.exit(1)
}
