// Package qemu is Corral's microvm backend: each sandbox is a QEMU "microvm" machine with a
// kernel of its own (Debian's cloud kernel), booted from an initramfs whose /init is
// corral-agent (internal/guestimage, internal/vmguest). It implements internal/runtime's
// Runtime (runtime name "qemu") with Pauser, Snapshotter, Forker, UsageReader, DiskHolder and,
// for the vm tier (a Spec with a BootDisk), Machine: it takes a runtime.Spec and gives a
// runtime.Sandbox, an agent socket the edge dials. It imports no other backend; the cgroups a
// VM's QEMU joins come from internal/runtime/cgroups.
//
// # What a VM is on the host
//
// Each VM owns <StateDir>/<id> (mode 0700, root's; QEMU never opens a path in it):
//
//	vm.json      the state: QEMU's argv, the files it gets as descriptors, its pid, its uid
//	upper.img    the writable disk: a sparse file of DiskBytes, ext4 made on the host
//	guest.json   the guest's configuration (vmguest.Config), read by the guest via fw_cfg
//	qmp.sock     QEMU's monitor (QMP), for pause, resume and the accelerator query
//	ctl.sock     the virtio-serial port "corral.ctl", the guest agent's only channel
//	agent.sock   what the edge dials: each connection becomes a stream over ctl.sock
//	             (internal/vmlink: yamux with a resync handshake)
//	console.log  the guest's serial console (the one file the VM's uid owns); qemu.log QEMU's stderr
//	snapshot.bin the VM's memory and device state while it is paused
//
// The layers are the layer store's files: each layer's EROFS image, and for a split layer its
// data blob as lazyd serves it (read on demand, like a container's), attached read-only as
// virtio-blk disks and shared by every VM on the node. The guest mounts them with EROFS itself
// (device= for the blob) under an overlay whose upper directory is on upper.img.
//
// # Isolation
//
// QEMU runs as a uid of its own per VM (Config.UIDBase + n), with no supplementary groups, in
// a session of its own (it outlives a restart of corral), in network and IPC namespaces of its
// own, with RLIMIT_NPROC bounding its threads, with QEMU's seccomp filter
// (-sandbox on, with obsolete, elevateprivileges, spawn and resourcecontrol denied). Every file
// it uses is a descriptor the runtime opens and passes (vmFile): the layers and the disk
// through -add-fd and /dev/fdset, the kernel, initramfs, guest config and console through
// /proc/self/fd, QMP and the port as listening sockets (chardev fd=), the tap. So it needs no
// access to the data directory, and none is given.
// There is no shared folder, no user-mode network and no monitor but QMP on a socket in the
// VM's directory. RLIMIT_FSIZE bounds every file it writes (the console a guest could flood).
//
// # Network
//
// With a network namespace (Spec.Netns) the namespace's eth0 and a tap are bridged inside it and
// the sandbox's address moves to the guest (vmnet.go): the egress policy on the host side of the
// veth applies unchanged. Without one the VM has no network device at all.
//
// # Pause and resume
//
// Pause stops the vCPUs, migrates the VM into snapshot.bin through a descriptor (QMP getfd and
// "migrate fd:"), and ends QEMU: all of the VM's memory goes back to the host. Resume starts the
// same command line with "-incoming defer", migrates the snapshot in and continues. The guest
// agent sees its host connection drop and come back, and reconnects; processes, files and
// commands' output survive. The writable disk is not in the snapshot and is not touched while
// paused.
//
// # Fork
//
// Fork stops the vCPUs, migrates the VM into a snapshot as Pause does, copies its writable disk
// and lets it run on ("cont" activates the disks the migration inactivated); each Create with
// Spec.Fork restores that snapshot into a VM of the same command line on its own copy of the disk
// and has its agent take on the copy's own address and hostname (fork.go). The images live in
// <StateDir>/.forks/ until DropFork.
//
// # Accelerator
//
// New chooses KVM when /dev/kvm opens and the guest kernel boots under it within 15 s, else TCG
// (software emulation) with a warning. The accelerator in use, as QEMU reports it
// (query-kvm), is recorded per VM.
package qemu
