//go:build race

package scoring_test

// raceEnabled reports a -race build: the toy side-by-side replay (a quality check whose
// concurrency paths other tests cover) is skipped there, being ~10× slower.
const raceEnabled = true
