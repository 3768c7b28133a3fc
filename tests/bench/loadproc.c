/* loadproc: many cheap, idle host processes for `make bench` (tests/bench/load.py).
 *
 * Usage: loadproc COUNT FDS
 * Forks COUNT children. Each child keeps FDS descriptors open besides stdin/out/err (half of
 * them its own opens of /dev/null, the rest the two ends of pipes) and sleeps in pause().
 * Once every child has reported in, the parent prints "ready N" (N = children set up) on
 * stdout and sleeps too; the children's stdin and stdout are /dev/null.
 * The parent dies with whoever started it, the children with the parent (PR_SET_PDEATHSIG),
 * so nothing outlives the bench; it is meant to run in its own process group, which the
 * bench kills with SIGKILL at the end.
 * Linked statically (gcc -static -O2): no loader, no shared libraries, a few pages each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "loadproc: %s: %s\n", what, strerror(errno));
    _exit(2);
}

static long number(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 0 || v > 100000) {
        fprintf(stderr, "loadproc: bad number: %s\n", s);
        exit(2);
    }
    return v;
}

static void die_with_parent(pid_t parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) die("prctl");
    if (getppid() != parent) _exit(0); /* the parent died before prctl */
}

int main(int argc, char **argv)
{
    long count, fds, i, j, up = 0;
    int ready[2], p[2], null;
    char c;
    pid_t self;

    if (argc != 3) {
        fprintf(stderr, "usage: loadproc COUNT FDS\n");
        return 2;
    }
    count = number(argv[1]);
    fds = number(argv[2]);
    die_with_parent(getppid());
    self = getpid();
    if (pipe(ready) < 0) die("pipe");
    for (i = 0; i < count; i++) {
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            die_with_parent(self);
            close(ready[0]);
            null = open("/dev/null", O_RDWR);
            if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0) die("/dev/null");
            close(null);
            for (j = 0; j < fds / 2; j++)
                if (open("/dev/null", O_RDONLY) < 0) die("open /dev/null");
            for (j = fds / 2; j + 1 < fds; j += 2)
                if (pipe(p) < 0) die("pipe");
            if (write(ready[1], "k", 1) != 1) die("write");
            close(ready[1]); /* EOF for the parent once every child got here or died */
            for (;;) pause();
        }
    }
    close(ready[1]);
    while (read(ready[0], &c, 1) > 0) up++;
    close(ready[0]);
    printf("ready %ld\n", up);
    fflush(stdout);
    for (;;) pause();
}
