package classify

import (
	"syscall"
	"unsafe"
)

// threadCPU is the calling thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID): time the
// thread was not running (another process on a shared core) is not counted. The caller
// holds runtime.LockOSThread.
func threadCPU() int64 {
	var ts syscall.Timespec
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

const cpuClock = "cpu"
