//go:build !race

package scoring_test

const raceEnabled = false
