//go:build !linux

package classify

import "time"

var epoch = time.Now()

// threadCPU falls back to wall time where the thread CPU clock is not read.
func threadCPU() int64 { return int64(time.Since(epoch)) }

const cpuClock = "wall"
