package main

// usernsinit.c: `corral-runcd userns-init`, internal/usernsinit's helper in C, run by a
// constructor before the Go runtime starts (as libcontainer/nsenter runs runc init's first
// steps). The runc runtime starts it, one per user namespace it makes ahead, instead of the
// agent's Go helper: the Go runtime's start was two thirds of the helper's cost, about 2 ms of
// CPU per sandbox.

import "C"
