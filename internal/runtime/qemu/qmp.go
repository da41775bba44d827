package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// qmp is a client of one QEMU's QMP monitor (a unix socket in the sandbox's directory). Calls
// are serialized; asynchronous events are skipped. QEMU accepts one monitor client at a time
// on the socket, so a qmp is short-lived: dial, run a few commands, close.
type qmp struct {
	mu   sync.Mutex
	conn *net.UnixConn
	rd   *bufio.Reader
}

// qmpError is an error QEMU answered with.
type qmpError struct {
	Class, Desc string
}

// Error quotes QEMU's class and description.
func (e *qmpError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// dialQMP connects to path and negotiates capabilities. The runtime binds the socket before
// QEMU starts and passes it listening, so a connect succeeds at once while QEMU holds it (QEMU
// accepts once it is ready) and is refused once QEMU is gone: a refusal is final.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("qmp: QEMU is not running (%s: %v)", path, err)
		}
		return nil, fmt.Errorf("qmp: connect %s: %w", path, err)
	}
	q := &qmp{conn: c.(*net.UnixConn), rd: bufio.NewReaderSize(c, 64<<10)}
	if err := q.handshake(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) handshake(ctx context.Context) error {
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.read(ctx, &greeting); err != nil {
		return fmt.Errorf("qmp: greeting: %w", err)
	}
	if greeting.QMP == nil {
		return errors.New("qmp: no greeting")
	}
	return q.run(ctx, "qmp_capabilities", nil, nil)
}

// Close ends the monitor connection.
func (q *qmp) Close() error { return q.conn.Close() }

// read decodes the next message that is not an event into v.
func (q *qmp) read(ctx context.Context, v any) error {
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetReadDeadline(dl)
	} else {
		q.conn.SetReadDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { q.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	for {
		line, err := q.rd.ReadBytes('\n')
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		var probe struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(line, &probe) == nil && probe.Event != "" {
			continue
		}
		return json.Unmarshal(line, v)
	}
}

// run executes one command and decodes its "return" into out (may be nil).
func (q *qmp) run(ctx context.Context, cmd string, args any, out any) error {
	return q.runFD(ctx, cmd, args, out, -1)
}

// runFD is run with a descriptor passed alongside the command (SCM_RIGHTS), as getfd and
// add-fd need.
func (q *qmp) runFD(ctx context.Context, cmd string, args any, out any, fd int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetWriteDeadline(dl)
	}
	if fd >= 0 {
		_, _, err = q.conn.WriteMsgUnix(b, unix.UnixRights(fd), nil)
	} else {
		_, err = q.conn.Write(b)
	}
	if err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := q.read(ctx, &resp); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("qmp %s: %w", cmd, &qmpError{Class: resp.Error.Class, Desc: resp.Error.Desc})
	}
	if out != nil && resp.Return != nil {
		if err := json.Unmarshal(resp.Return, out); err != nil {
			return fmt.Errorf("qmp %s: decode: %w", cmd, err)
		}
	}
	return nil
}

// sendFile passes f to QEMU under name (QMP getfd), for a later "fd:name" migration URI.
func (q *qmp) sendFile(ctx context.Context, name string, f *os.File) error {
	return q.runFD(ctx, "getfd", map[string]string{"fdname": name}, nil, int(f.Fd()))
}

// status returns the VM's run state ("running", "paused", "inmigrate", "postmigrate", ...).
func (q *qmp) status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.run(ctx, "query-status", nil, &st)
	return st.Status, err
}

// accelerator asks QEMU which accelerator really runs the VM: "kvm" or "tcg".
func (q *qmp) accelerator(ctx context.Context) (string, error) {
	var kvm struct {
		Enabled bool `json:"enabled"`
	}
	if err := q.run(ctx, "query-kvm", nil, &kvm); err != nil {
		return "", err
	}
	if kvm.Enabled {
		return AccelKVM, nil
	}
	return AccelTCG, nil
}

// migrationStatus is query-migrate's answer.
type migrationStatus struct {
	Status string `json:"status"`
	Error  string `json:"error-desc"`
	RAM    struct {
		Total       int64 `json:"total"`
		Transferred int64 `json:"transferred"`
	} `json:"ram"`
}

// waitMigration polls query-migrate until the migration completes or fails.
func (q *qmp) waitMigration(ctx context.Context) (migrationStatus, error) {
	for {
		var st migrationStatus
		if err := q.run(ctx, "query-migrate", nil, &st); err != nil {
			return st, err
		}
		switch st.Status {
		case "completed":
			return st, nil
		case "failed", "cancelled":
			return st, fmt.Errorf("qmp: migration %s: %s", st.Status, st.Error)
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("qmp: migration still %s: %w", st.Status, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
