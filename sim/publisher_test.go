package sim

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

func oneEvent(tok uint32) Batch {
	return Batch{TS: 1, Events: []Event{{Kind: BlockRemoved, Hashes: []uint64{uint64(tok) << 40}, Medium: "GPU"}}}
}

func newTestPublisher(t *testing.T, legacy bool) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherOptions{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv@t", LegacyReplay: legacy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestPublisherFramesSeqAndReplay(t *testing.T) {
	p := newTestPublisher(t, false)
	sub, _ := zmq.NewSocket(zmq.SUB)
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetSubscribe("")
	if err := sub.Connect(p.PubAddr); err != nil {
		t.Fatal(err)
	}
	poller := zmq.NewPoller()
	poller.Add(sub, zmq.POLLIN)
	// PUB drops messages until the subscription has propagated: publish until one arrives.
	var msg [][]byte
	for i := 0; i < 200 && msg == nil; i++ {
		if err := p.Publish(oneEvent(uint32(i))); err != nil {
			t.Fatal(err)
		}
		if ps, _ := poller.Poll(20 * time.Millisecond); len(ps) > 0 {
			msg, _ = sub.RecvMessageBytes(0)
		}
	}
	if len(msg) != 3 || string(msg[0]) != "kv@t" || len(msg[1]) != 8 {
		t.Fatalf("frames %q, want [topic, seq8, payload]", msg)
	}
	seq := binary.BigEndian.Uint64(msg[1])
	if err := p.Publish(oneEvent(7777)); err != nil {
		t.Fatal(err)
	}
	next, err := sub.RecvMessageBytes(0)
	if err != nil || binary.BigEndian.Uint64(next[1]) != seq+1 {
		t.Fatalf("next seq %x, want %d", next[1], seq+1)
	}
	if !bytes.Equal(next[2], MapEncoder{}.Encode(oneEvent(7777))) {
		t.Error("payload is not the map-encoded batch")
	}
	// Empty batches are not sent and take no seq.
	_ = p.Publish(Batch{})
	total := seq + 2

	// Replay from seq 1: every buffered batch from 1 on, then the end marker.
	got := replay(t, p.ReplayAddr, 1)
	if uint64(len(got)) != total-1 {
		t.Fatalf("replayed %d batches, want %d", len(got), total-1)
	}
	for i, m := range got {
		if len(m) != 4 || string(m[0]) != "" || string(m[1]) != "kv@t" || binary.BigEndian.Uint64(m[2]) != uint64(i+1) {
			t.Fatalf("replay %d frames %q", i, m)
		}
	}
}

// replay asks a ROUTER for batches from seq and returns the replies before the end marker.
func replay(t *testing.T, addr string, from uint64) [][][]byte {
	t.Helper()
	d, _ := zmq.NewSocket(zmq.DEALER)
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(5 * time.Second)
	if err := d.Connect(addr); err != nil {
		t.Fatal(err)
	}
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], from)
	if _, err := d.SendMessage("", s8[:]); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		m, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay recv: %v", err)
		}
		if len(m) == 4 && len(m[1]) == 0 && bytes.Equal(m[2], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) {
			return out
		}
		out = append(out, m)
	}
}

func TestPublisherRestartsAtSeqZeroAndLegacyReplay(t *testing.T) {
	for round := 0; round < 2; round++ {
		p := newTestPublisher(t, true)
		_ = p.Publish(oneEvent(1))
		_ = p.Publish(oneEvent(2))
		got := replay(t, p.ReplayAddr, 0)
		if len(got) != 2 {
			t.Fatalf("round %d: %d replies", round, len(got))
		}
		for i, m := range got {
			// Legacy replay (vLLM < 0.26): ["", seq8, payload], no topic frame.
			if len(m) != 3 || binary.BigEndian.Uint64(m[1]) != uint64(i) {
				t.Fatalf("round %d reply %d: %q", round, i, m)
			}
		}
		_ = p.Close()
		if err := p.Publish(oneEvent(3)); err != ErrClosed {
			t.Fatalf("publish after close: %v", err)
		}
	}
}

func TestPublisherConnectModeAndBadEndpoint(t *testing.T) {
	sub, _ := zmq.NewSocket(zmq.SUB)
	defer sub.Close()
	_ = sub.SetLinger(0)
	if err := sub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := sub.GetLastEndpoint()
	p, err := NewPublisher(PublisherOptions{Endpoint: ep}) // no "*": vLLM's rule connects
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.PubAddr != ep {
		t.Errorf("connect mode PubAddr %q, want %q", p.PubAddr, ep)
	}
	if _, err := NewPublisher(PublisherOptions{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "bogus://x"}); err == nil {
		t.Error("bad replay endpoint accepted")
	}
	if !shouldBind("tcp://*:5557") || !shouldBind("ipc:///tmp/x") || shouldBind("tcp://10.0.0.1:5557") {
		t.Error("bind rule differs from vLLM's")
	}
}
