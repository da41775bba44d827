package seccompbpf

import (
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

const (
	opLoad = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	opAnd  = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	opRet  = unix.BPF_RET | unix.BPF_K
	opJa   = unix.BPF_JMP | unix.BPF_JA
	opJeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	opJgt  = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K
	opJge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
)

// label names a place in the program; jumps go forward to labels only.
type label int

// item is an instruction, a conditional jump to two labels, or a label's place.
type item struct {
	in     unix.SockFilter
	jump   bool  // a conditional jump to yes and no
	yes    label // where a jump goes when its condition holds
	no     label
	mark   bool // not an instruction: the place of at
	at     label
	far    bool // the jump's targets are out of its 8-bit reach: it takes two more instructions (JA)
	offset int  // its first instruction's index
}

// asm builds a program of items and resolves its labels.
type asm struct {
	items  []item
	labels int
}

func (a *asm) label() label { a.labels++; return label(a.labels) }

func (a *asm) place(l label) { a.items = append(a.items, item{mark: true, at: l}) }

func (a *asm) stmt(code uint16, k uint32) {
	a.items = append(a.items, item{in: unix.SockFilter{Code: code, K: k}})
}

// jump goes to yes when the condition (code, k) holds for the accumulator, else to no.
func (a *asm) jump(code uint16, k uint32, yes, no label) {
	a.items = append(a.items, item{in: unix.SockFilter{Code: code, K: k}, jump: true, yes: yes, no: no})
}

// resolve lays the items out and returns the program. A conditional jump reaches 255
// instructions ahead; one whose targets lie further becomes the jump to its next two
// instructions, each a JA (32-bit reach) to a target. Growing a jump only lengthens others, so
// the layout is redone until no jump grows.
func (a *asm) resolve() (Program, error) {
	for {
		at := map[label]int{}
		n := 0
		for i := range a.items {
			it := &a.items[i]
			it.offset = n
			switch {
			case it.mark:
				at[it.at] = n
			case it.far:
				n += 3
			default:
				n++
			}
		}
		if n > MaxInstructions {
			return nil, fmt.Errorf("%w: the program has %d instructions, over the kernel's %d", ErrUnsupported, n, MaxInstructions)
		}
		grew := false
		for i := range a.items {
			it := &a.items[i]
			if !it.jump || it.far {
				continue
			}
			if at[it.yes]-it.offset-1 > 255 || at[it.no]-it.offset-1 > 255 {
				it.far, grew = true, true
			}
		}
		if grew {
			continue
		}
		p := make(Program, 0, n)
		for _, it := range a.items {
			switch {
			case it.mark:
			case !it.jump:
				p = append(p, it.in)
			default:
				yes, no := at[it.yes], at[it.no]
				if yes == 0 || no == 0 || yes <= it.offset || no <= it.offset {
					return nil, fmt.Errorf("seccomp: a jump at %d goes to an unplaced or earlier label", it.offset)
				}
				in := it.in
				if it.far {
					in.Jt, in.Jf = 0, 1
					p = append(p, in,
						unix.SockFilter{Code: opJa, K: uint32(yes - it.offset - 2)},
						unix.SockFilter{Code: opJa, K: uint32(no - it.offset - 3)})
					continue
				}
				in.Jt, in.Jf = uint8(yes-it.offset-1), uint8(no-it.offset-1)
				p = append(p, in)
			}
		}
		return p, nil
	}
}

// assemble writes the program for calls: the architecture check, the ENOSYS for calls above
// maxNr, a binary search over the call numbers to each call's rules, and the default.
func assemble(calls map[uint32]*call, def, maxNr uint32) (Program, error) {
	a := &asm{}
	rets := map[uint32]label{} // one return instruction per action, jumped to
	ret := func(action uint32) label {
		l, ok := rets[action]
		if !ok {
			l = a.label()
			rets[action] = l
		}
		return l
	}
	kill := ret(unix.SECCOMP_RET_KILL_PROCESS)
	a.stmt(opLoad, offArch)
	native := a.label()
	a.jump(opJeq, nativeAudit, native, kill)
	a.place(native)
	a.stmt(opLoad, offNr)
	if hasX32 {
		// Call -1 (a tracer skipping a call) is no x32 call: it takes the filter's way like
		// any unnamed call, as libseccomp has it.
		notX32, check := a.label(), a.label()
		a.jump(opJeq, 0xffffffff, notX32, check)
		a.place(check)
		a.jump(opJge, x32Bit, kill, notX32)
		a.place(notX32)
	}
	if def != unix.SECCOMP_RET_ALLOW && len(calls) > 0 {
		known := a.label()
		a.jump(opJgt, maxNr, ret(unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS)), known)
		a.place(known)
	}
	nrs := make([]uint32, 0, len(calls))
	for nr := range calls {
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	body := map[uint32]label{} // each call's rules, placed after the search
	plain := func(c *call) bool { return len(c.guards) == 0 && len(c.rules) == 1 && len(c.rules[0].conds) == 0 }
	for _, nr := range nrs {
		if c := calls[nr]; plain(c) {
			body[nr] = ret(c.rules[0].action)
		} else {
			body[nr] = a.label()
		}
	}
	// The search: the accumulator holds the call number throughout.
	var search func(lo, hi int, at label)
	search = func(lo, hi int, at label) {
		a.place(at)
		if hi-lo == 1 {
			a.jump(opJeq, nrs[lo], body[nrs[lo]], ret(def))
			return
		}
		mid := (lo + hi) / 2
		upper, lower := a.label(), a.label()
		a.jump(opJge, nrs[mid], upper, lower)
		search(lo, mid, lower)
		search(mid, hi, upper)
	}
	if len(nrs) > 0 {
		search(0, len(nrs), a.label())
	} else {
		a.stmt(opRet, def)
	}
	// The calls whose rules compare arguments.
	refuse := unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	for _, nr := range nrs {
		c := calls[nr]
		if plain(c) {
			continue
		}
		a.place(body[nr])
		for _, g := range c.guards {
			next := a.label()
			for _, cond := range g.Conds {
				pass := a.label()
				guardCompare(a, cond, pass, next)
				a.place(pass)
			}
			a.stmt(opRet, refuse) // every condition held
			a.place(next)
		}
		for _, r := range c.rules {
			fail := a.label()
			for _, cond := range r.conds {
				pass := a.label()
				compare(a, cond, pass, fail)
				a.place(pass)
			}
			a.stmt(opRet, r.action)
			a.place(fail)
		}
		a.stmt(opRet, def)
	}
	// The returns, in a fixed order so that a profile compiles to the same program every time.
	actions := make([]uint32, 0, len(rets))
	for act := range rets {
		actions = append(actions, act)
	}
	slices.Sort(actions)
	for _, act := range actions {
		a.place(rets[act])
		a.stmt(opRet, act)
	}
	return a.resolve()
}

// compare goes to pass when the 64-bit argument comparison c holds, else to fail. It loads the
// argument's halves into the accumulator.
func compare(a *asm, c specs.LinuxSeccompArg, pass, fail label) {
	lo := uint32(offArgs + 8*c.Index)
	hi := lo + 4
	v, w := c.Value, c.ValueTwo
	vhi, vlo := uint32(v>>32), uint32(v)
	switch c.Op {
	case specs.OpEqualTo:
		l := a.label()
		a.stmt(opLoad, hi)
		a.jump(opJeq, vhi, l, fail)
		a.place(l)
		a.stmt(opLoad, lo)
		a.jump(opJeq, vlo, pass, fail)
	case specs.OpNotEqual:
		l := a.label()
		a.stmt(opLoad, hi)
		a.jump(opJeq, vhi, l, pass)
		a.place(l)
		a.stmt(opLoad, lo)
		a.jump(opJeq, vlo, fail, pass)
	case specs.OpMaskedEqual: // (arg & v) == w
		l := a.label()
		a.stmt(opLoad, hi)
		a.stmt(opAnd, vhi)
		a.jump(opJeq, uint32(w>>32), l, fail)
		a.place(l)
		a.stmt(opLoad, lo)
		a.stmt(opAnd, vlo)
		a.jump(opJeq, uint32(w), pass, fail)
	case specs.OpGreaterThan, specs.OpGreaterEqual: // hi > vhi, or hi == vhi and lo > (>=) vlo
		eq, l := a.label(), a.label()
		a.stmt(opLoad, hi)
		a.jump(opJgt, vhi, pass, eq)
		a.place(eq)
		a.jump(opJeq, vhi, l, fail)
		a.place(l)
		a.stmt(opLoad, lo)
		op := uint16(opJgt)
		if c.Op == specs.OpGreaterEqual {
			op = opJge
		}
		a.jump(op, vlo, pass, fail)
	case specs.OpLessThan, specs.OpLessEqual: // hi < vhi, or hi == vhi and lo < (<=) vlo
		eq, l := a.label(), a.label()
		a.stmt(opLoad, hi)
		a.jump(opJgt, vhi, fail, eq)
		a.place(eq)
		a.jump(opJeq, vhi, l, pass)
		a.place(l)
		a.stmt(opLoad, lo)
		if c.Op == specs.OpLessThan {
			a.jump(opJge, vlo, fail, pass)
		} else {
			a.jump(opJgt, vlo, fail, pass)
		}
	}
}

// guardCompare goes to pass when the guard condition c holds, else to fail.
func guardCompare(a *asm, c GuardCond, pass, fail label) {
	lo := uint32(offArgs + 8*c.Arg)
	if c.NonZero {
		l := a.label()
		a.stmt(opLoad, lo)
		a.jump(opJeq, 0, l, pass)
		a.place(l)
		a.stmt(opLoad, lo+4)
		a.jump(opJeq, 0, fail, pass)
		return
	}
	a.stmt(opLoad, lo)
	for i, v := range c.In {
		if i == len(c.In)-1 {
			a.jump(opJeq, v, pass, fail)
			return
		}
		next := a.label()
		a.jump(opJeq, v, pass, next)
		a.place(next)
	}
}
