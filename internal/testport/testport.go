// Package testport hands tests loopback TCP ports for a server that binds later: a child
// process (vllm-sim, kvroute) or a ZMQ socket given the port in its endpoint.
//
// The usual way, listening on 127.0.0.1:0 and closing the listener, returns a port from
// the kernel's ephemeral range (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768–60999
// by default). Until the server binds it, every outgoing loopback connection of every test
// process on the machine draws its source port from that same range, and so does every
// other :0 listener: on a loaded CI machine one of them takes the port first and the
// server exits with "address already in use". Ports from Free and Consecutive lie below
// (or, if the range starts low, above) the ephemeral range, where the kernel never assigns
// a port by itself; each is checked free by binding it once, and a process never hands out
// the same port twice. Processes that bind ports they chose themselves in that window can
// still collide, far less often.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// windowSize is how many ports the window below (or above) the ephemeral range spans.
const windowSize = 16384

var (
	mu       sync.Mutex
	lo, size int // the window [lo, lo+size); size 0: no window, use :0
	next     int // offset into the window of the next port to try
	inited   bool
)

// ephemeralRange reads the kernel's ephemeral port range; Linux's default when unreadable.
func ephemeralRange() (int, int) {
	first, last := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var a, z int
		if n, _ := fmt.Sscanf(string(b), "%d %d", &a, &z); n == 2 && a > 0 && z >= a {
			first, last = a, z
		}
	}
	return first, last
}

func initLocked() {
	if inited {
		return
	}
	inited = true
	first, last := ephemeralRange()
	switch {
	case first-1024 >= 2048: // below the range, above the privileged ports
		size = min(windowSize, first-1024)
		lo = first - size
	case 65535-last >= 2048:
		size = min(windowSize, 65535-last)
		lo = last + 1
	default: // the range covers nearly every port: nothing better than :0
		size = 0
	}
	if size > 0 {
		next = rand.IntN(size) // processes started together start apart
	}
}

// Free returns n distinct TCP ports on 127.0.0.1 that were free when checked. It fails t
// when none can be found.
func Free(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for len(ports) < n {
		ports = append(ports, Consecutive(t, 1))
	}
	return ports
}

// Consecutive returns the first of n consecutive TCP ports on 127.0.0.1 (port, port+1,
// …, port+n-1) that were all free when checked: for data-parallel ranks that publish on
// port + rank. It fails t when no such run can be found.
func Consecutive(t testing.TB, n int) int {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	initLocked()
	if size == 0 || n > size {
		return kernelConsecutive(t, n)
	}
	for tried := 0; tried < size; tried += n {
		if next+n > size {
			next = 0
		}
		base := lo + next
		next += n
		if bindable(base, n) {
			return base
		}
	}
	t.Fatalf("testport: no %d consecutive free ports in [%d, %d)", n, lo, lo+size)
	return 0
}

// bindable reports whether ports base … base+n-1 can all be bound on 127.0.0.1 now.
func bindable(base, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// kernelConsecutive is the fallback when no window exists: a kernel-chosen :0 port and
// the n-1 after it.
func kernelConsecutive(t testing.TB, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if bindable(base, n) {
			return base
		}
	}
	t.Fatalf("testport: no %d consecutive free ports", n)
	return 0
}
