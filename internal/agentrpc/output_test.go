package agentrpc

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// readAll reads o from off as the streamer would, returning the bytes per stream and the drops.
func readAll(o *output, off int64) (stdout, stderr []byte, dropped int64, end int64) {
	buf := make([]byte, 7) // small, to cross segment and wrap boundaries often
	for {
		ch := o.read(off, buf)
		switch ch.kind {
		case chunkData:
			if ch.stream == streamStdout {
				stdout = append(stdout, buf[:ch.n]...)
			} else {
				stderr = append(stderr, buf[:ch.n]...)
			}
			off = ch.off + int64(ch.n)
		case chunkTruncated:
			dropped += ch.dropped
			off = ch.off
		default:
			return stdout, stderr, dropped, off
		}
	}
}

func TestOutputKeepsStreamsApart(t *testing.T) {
	o := newOutput(1 << 10)
	o.write(streamStdout, []byte("out1 "))
	o.write(streamStderr, []byte("err1 "))
	o.write(streamStdout, []byte("out2"))
	stdout, stderr, dropped, end := readAll(o, 0)
	if string(stdout) != "out1 out2" || string(stderr) != "err1 " || dropped != 0 || end != 14 {
		t.Errorf("got stdout %q stderr %q dropped %d end %d", stdout, stderr, dropped, end)
	}
	// From an offset inside the second segment.
	stdout, stderr, _, _ = readAll(o, 7)
	if string(stdout) != "out2" || string(stderr) != "r1 " {
		t.Errorf("from 7: got stdout %q stderr %q", stdout, stderr)
	}
}

func TestOutputDropsOldestAtLimit(t *testing.T) {
	const limit = 100
	o := newOutput(limit)
	var all bytes.Buffer
	for i := 0; i < 50; i++ {
		line := fmt.Sprintf("line %02d\n", i) // 8 bytes
		all.WriteString(line)
		o.write(streamStdout, []byte(line))
	}
	start, end := o.bounds()
	if end != 400 || end-start != limit {
		t.Fatalf("bounds [%d, %d), want [300, 400)", start, end)
	}
	if len(o.buf) > limit {
		t.Errorf("ring is %d bytes, limit %d", len(o.buf), limit)
	}
	stdout, _, dropped, _ := readAll(o, 0)
	if dropped != 300 || !bytes.Equal(stdout, all.Bytes()[300:]) {
		t.Errorf("dropped %d (want 300), kept %q", dropped, stdout)
	}
	// One write larger than the limit keeps its tail.
	o.write(streamStderr, bytes.Repeat([]byte("x"), 3*limit))
	start, end = o.bounds()
	_, stderr, _, _ := readAll(o, start)
	if end != 700 || start != 600 || len(stderr) != limit {
		t.Errorf("after a huge write: bounds [%d, %d), stderr %d bytes", start, end, len(stderr))
	}
}

func TestOutputBoundsSegments(t *testing.T) {
	o := newOutput(1 << 20)
	o.maxSegs = 8
	for i := 0; i < 100; i++ {
		o.write(uint8(i%2)+1, []byte{'a' + byte(i%26)})
	}
	if len(o.segs) > 8 {
		t.Errorf("%d segments kept, max 8", len(o.segs))
	}
	start, end := o.bounds()
	if end != 100 || end-start > 8 {
		t.Errorf("bounds [%d, %d)", start, end)
	}
}

// TestOutputMatchesModel writes random chunks to random streams and checks every read against a
// plain copy of everything written.
func TestOutputMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		limit := int64(1 + rng.IntN(300))
		o := newOutput(limit)
		var all []byte
		var streams []uint8
		for w := 0; w < 40; w++ {
			p := make([]byte, rng.IntN(120))
			for i := range p {
				p[i] = byte(rng.IntN(256))
			}
			st := uint8(1 + rng.IntN(2))
			o.write(st, p)
			all = append(all, p...)
			for range p {
				streams = append(streams, st)
			}
		}
		start, end := o.bounds()
		if end != int64(len(all)) || end-start > limit || (end-start < min(limit, end) && len(o.segs) < o.maxSegs) {
			t.Fatalf("iter %d: bounds [%d, %d) of %d, limit %d", iter, start, end, len(all), limit)
		}
		off := int64(rng.IntN(len(all) + 1))
		buf := make([]byte, 1+rng.IntN(50))
		for {
			ch := o.read(off, buf)
			if ch.kind == chunkTruncated {
				if off >= start || ch.off != start {
					t.Fatalf("iter %d: truncated at %d to %d, start %d", iter, off, ch.off, start)
				}
				off = ch.off
				continue
			}
			if ch.kind != chunkData {
				break
			}
			for i := 0; i < ch.n; i++ {
				if buf[i] != all[ch.off+int64(i)] || streams[ch.off+int64(i)] != ch.stream {
					t.Fatalf("iter %d: byte at %d differs", iter, ch.off+int64(i))
				}
			}
			off = ch.off + int64(ch.n)
		}
		o.close(&Exit{})
		if int64(len(o.buf)) != end-start {
			t.Fatalf("iter %d: closed ring %d bytes, kept %d", iter, len(o.buf), end-start)
		}
		got, _, _, _ := readAll(o, start)
		gotErr := []byte(nil)
		_, gotErr, _, _ = readAll(o, start)
		var wantOut, wantErr []byte
		for i := start; i < end; i++ {
			if streams[i] == streamStdout {
				wantOut = append(wantOut, all[i])
			} else {
				wantErr = append(wantErr, all[i])
			}
		}
		if !bytes.Equal(got, wantOut) || !bytes.Equal(gotErr, wantErr) {
			t.Fatalf("iter %d: after close, output differs", iter)
		}
	}
}

func TestOutputWaitAndEnd(t *testing.T) {
	o := newOutput(64)
	ch := o.read(0, make([]byte, 8))
	if ch.kind != chunkWait {
		t.Fatalf("empty output: kind %d, want wait", ch.kind)
	}
	o.write(streamStdout, []byte("x"))
	select {
	case <-ch.wait:
	default:
		t.Fatal("write did not wake the waiter")
	}
	o.close(&Exit{Code: 2})
	if ch := o.read(1, make([]byte, 8)); ch.kind != chunkEnd || ch.exit.Code != 2 || ch.off != 1 {
		t.Errorf("after close: %+v", ch)
	}
	o.write(streamStdout, []byte("late")) // ignored
	if _, end := o.bounds(); end != 1 {
		t.Errorf("write after close was kept: end %d", end)
	}
}
