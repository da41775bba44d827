package agentrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestFrameRoundTrip(t *testing.T) {
	frames := []struct {
		typ          byte
		prefix, data []byte
	}{
		{frameRequest, nil, []byte(`{"op":"ping"}`)},
		{frameEnd, nil, nil},
		{frameStdout, []byte{0, 0, 0, 0, 0, 0, 0, 7}, []byte("hello")},
		{frameData, nil, bytes.Repeat([]byte{0xff}, maxFramePayload)},
	}
	var buf bytes.Buffer
	f := newFramer(&buf)
	for _, fr := range frames {
		if err := f.writeFrame(fr.typ, fr.prefix, fr.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.flush(); err != nil {
		t.Fatal(err)
	}
	r := newFramer(&buf)
	for i, fr := range frames {
		typ, p, err := r.readFrame()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		want := append(append([]byte{}, fr.prefix...), fr.data...)
		if typ != fr.typ || !bytes.Equal(p, want) {
			t.Errorf("frame %d: got %q (%d bytes), want %q (%d bytes)", i, typ, len(p), fr.typ, len(want))
		}
	}
	if _, _, err := r.readFrame(); err != io.EOF {
		t.Errorf("after the last frame: got %v, want io.EOF", err)
	}
}

func TestReadFrameRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"too large", []byte{'D', 0x00, 0x10, 0x00, 0x01}, errProtocol},
		{"truncated header", []byte{'D', 0}, io.ErrUnexpectedEOF},
		{"truncated payload", []byte{'D', 0, 0, 0, 4, 'a'}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf []byte
			_, _, err := readFrameInto(bytes.NewReader(tt.in), &buf)
			if !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeEvent(t *testing.T) {
	off := func(n int64, rest ...byte) []byte {
		b := binary.BigEndian.AppendUint64(nil, uint64(n))
		return append(b, rest...)
	}
	tests := []struct {
		name    string
		typ     byte
		payload []byte
		want    Event
		wantErr bool
	}{
		{"stdout", frameStdout, off(3, 'h', 'i'), Event{Type: EventStdout, Offset: 3, Data: []byte("hi")}, false},
		{"stderr", frameStderr, off(0, 'x'), Event{Type: EventStderr, Offset: 0, Data: []byte("x")}, false},
		{"truncated", frameTruncated, off(10, 0, 0, 0, 0, 0, 0, 0, 4), Event{Type: EventTruncated, Offset: 10, Dropped: 4}, false},
		{"exit", frameExit, off(5, []byte(`{"code":3}`)...), Event{Type: EventExit, Offset: 5, Exit: &Exit{Code: 3}}, false},
		{"short", frameStdout, []byte{1, 2}, Event{}, true},
		{"negative offset", frameStdout, off(-1), Event{}, true},
		{"bad truncated", frameTruncated, off(1, 1), Event{}, true},
		{"bad exit", frameExit, off(1, '{'), Event{}, true},
		{"unknown", 'q', off(1), Event{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeEvent(tt.typ, tt.payload)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestErrorKindsSurviveTheWire(t *testing.T) {
	kinds := []error{
		errdefs.ErrInvalid, errdefs.ErrDenied, errdefs.ErrNotFound, errdefs.ErrConflict,
		errdefs.ErrTooLarge, errdefs.ErrExhausted, errdefs.ErrUnavailable, errdefs.ErrUnauthorized,
	}
	for _, kind := range kinds {
		var buf bytes.Buffer
		f := newFramer(&buf)
		sent := fmt.Errorf("stat /x: %w", kind)
		if err := f.writeError(sent); err != nil {
			t.Fatal(err)
		}
		typ, p, err := newFramer(&buf).readFrame()
		if err != nil || typ != frameError {
			t.Fatalf("got frame %q, %v", typ, err)
		}
		got := decodeError(p)
		if !errors.Is(got, kind) || got.Error() != sent.Error() {
			t.Errorf("kind %v: got %q (code %s), want %q", kind, got, errdefs.Code(got), sent)
		}
	}
	// An invalid-field error keeps its field.
	var buf bytes.Buffer
	newFramer(&buf).writeError(errdefs.Invalid("argv", "must name a program"))
	_, p, _ := newFramer(&buf).readFrame()
	got := decodeError(p)
	if errdefs.Field(got) != "argv" || got.Error() != "argv: must name a program" || !errors.Is(got, errdefs.ErrInvalid) {
		t.Errorf("got %q field %q", got, errdefs.Field(got))
	}
}

// FuzzReadFrame feeds arbitrary bytes to the frame decoder and, for what decodes, to the event
// and error decoders: nothing may panic, a decoded payload never exceeds the limit, and re-encoding
// a decoded frame gives back the same bytes.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{'Q', 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{'1', 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 'x'})
	f.Add([]byte{'X', 0, 0, 0, 18, 0, 0, 0, 0, 0, 0, 0, 1, '{', '"', 'c', 'o', 'd', 'e', '"', ':', '1', '}'})
	f.Add([]byte{'E', 0, 0, 0, 2, '{', '}', 'T', 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{'D', 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		var buf []byte
		for {
			typ, p, err := readFrameInto(r, &buf)
			if err != nil {
				return
			}
			if len(p) > maxFramePayload {
				t.Fatalf("payload of %d bytes accepted", len(p))
			}
			var out bytes.Buffer
			w := newFramer(&out)
			if err := w.writeFrame(typ, nil, p); err != nil {
				t.Fatal(err)
			}
			w.flush()
			typ2, p2, err := readFrameInto(&out, new([]byte))
			if err != nil || typ2 != typ || !bytes.Equal(p2, p) {
				t.Fatalf("re-encoded frame differs: %q %q vs %q %q (%v)", typ, p, typ2, p2, err)
			}
			switch typ {
			case frameError:
				decodeError(p)
			default:
				ev, err := decodeEvent(typ, p)
				if err == nil && ev.Offset < 0 {
					t.Fatalf("negative offset decoded: %+v", ev)
				}
			}
		}
	})
}

// FuzzDataReader checks that a stream of arbitrary frames read as a data stream ends in data,
// EOF or an error, never a panic or a read past a frame.
func FuzzDataReader(f *testing.F) {
	f.Add([]byte{'D', 0, 0, 0, 3, 'a', 'b', 'c', 'Z', 0, 0, 0, 0})
	f.Add([]byte{'D', 0, 0, 0, 1, 'a', 'E', 0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		d := &dataReader{f: newFramer(bytes.NewBuffer(in))}
		n, _ := io.Copy(io.Discard, d)
		if n > int64(len(in)) {
			t.Fatalf("read %d bytes from %d", n, len(in))
		}
	})
}
