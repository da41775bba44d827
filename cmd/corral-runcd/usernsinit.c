// `corral-runcd userns-init KEY=N...`: internal/usernsinit's helper (the same arguments, and
// "ok" once done; its error lines are worded its own way), done here in C before the Go runtime
// starts, so that each user namespace Corral
// makes costs an exec and a few system calls instead of a Go runtime's start (see
// usernsinit.go). It sets the namespace's inotify budgets, prints "ok" and holds the namespace
// until its standard input ends.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void say(const char *s) {
	size_t n = strlen(s);
	while (n > 0) {
		ssize_t w = write(STDOUT_FILENO, s, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

// set writes value to /proc/sys/user/key: in this namespace, with its CAP_SYS_RESOURCE, that
// sets this namespace's limit. On failure it prints the helper's error line and exits.
static void set(const char *arg) {
	const char *eq = strchr(arg, '=');
	size_t klen = eq ? (size_t)(eq - arg) : 0;
	char line[256];
	if (eq == NULL ||
	    !((klen == strlen("max_inotify_instances") && strncmp(arg, "max_inotify_instances", klen) == 0) ||
	      (klen == strlen("max_inotify_watches") && strncmp(arg, "max_inotify_watches", klen) == 0)) ||
	    eq[1] == '\0' || strspn(eq + 1, "0123456789") != strlen(eq + 1) || strlen(eq + 1) > 19) {
		snprintf(line, sizeof line, "unknown setting \"%.100s\"\n", arg);
		say(line);
		_exit(2);
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/sys/user/%.*s", (int)klen, arg);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	const char *v = eq + 1;
	size_t vlen = strlen(v);
	ssize_t w = fd < 0 ? -1 : write(fd, v, vlen);
	if (w >= 0 && w != (ssize_t)vlen)
		errno = EIO; // a short write sets no errno
	if (fd < 0 || w != (ssize_t)vlen) {
		snprintf(line, sizeof line, "set %.*s: %s\n", (int)klen, arg, strerror(errno));
		say(line);
		_exit(1);
	}
	close(fd);
}

__attribute__((constructor)) static void corral_userns_init(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc < 2 || strcmp(argv[1], "userns-init") != 0)
		return;
	for (int i = 2; i < argc; i++)
		set(argv[i]);
	say("ok\n");
	char buf[512];
	for (;;) {
		ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		break;
	}
	_exit(0);
}
