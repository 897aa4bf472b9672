package zmqsub

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/kvindex/kvtest"
)

// Monitored sockets are closed while connect and disconnect events are still being
// raised (a SUB closed right after Connect): monitor's stop ends the monitoring before
// its PAIR closes, so libzmq's I/O thread never blocks sending an event to a PAIR
// without a peer — which froze every socket of the context. Afterwards a fresh SUB
// still receives.
func TestMonitorCloseKeepsContextAlive(t *testing.T) {
	h := newHarness(t)
	p := newPublisher(t, kvtest.Options{})
	for i := 0; i < 200; i++ {
		sock, err := h.mgr.newSocket(zmq.SUB)
		if err != nil {
			t.Fatal(err)
		}
		_, stop := h.mgr.monitor(sock, zmq.EVENT_DISCONNECTED|zmq.EVENT_CONNECTED)
		if err := sock.Connect(p.Endpoint()); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			time.Sleep(time.Millisecond) // sometimes after the connect event
		}
		stop()
		sock.Close()
	}
	h.addWorkers(workerFor("a", p))
	h.connected("a", p) // times out when the I/O thread is frozen
	_, _ = p.Publish(storedBatch(0, 1, 1, nil))
	h.eventually(func() bool { return h.held("a", toks(0, 1)) == 1 }, "batch not applied")
}
