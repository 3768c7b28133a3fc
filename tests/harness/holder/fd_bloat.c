/* fd_bloat --procs N --fds M --ready FILE [--exit-after S] [PATH]: N processes, each with M
 * open fds of PATH (default /dev/null: one open, then dup(), so the kernel keeps one file),
 * RLIMIT_NOFILE raised to its hard limit (M is cut to what it allows). One ready line when
 * all are set up. SIGTERM ends each. Issue 26: "40 processes with 20,000 fds each". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *path = "/dev/null", *ready = NULL;
    long procs = 1, fds = 1000, exit_after = 3600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
        else if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = atol(argv[++i]);
        else if (!strcmp(argv[i], "--fds") && i + 1 < argc) fds = atol(argv[++i]);
        else if (!strcmp(argv[i], "--exit-after") && i + 1 < argc) exit_after = atol(argv[++i]);
        else if (!strcmp(argv[i], "--")) break;
        else path = argv[i];
    }
    struct rlimit rl = {1024, 1024};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if ((long)rl.rlim_cur - 16 < fds) fds = (long)rl.rlim_cur - 16; /* room for the ready file */
    int fd = open(path, O_RDONLY);
    if (fd < 0) { fprintf(stderr, "fd_bloat: %s: %s\n", path, strerror(errno)); return 2; }
    long have = fd + 1;
    while (have < fds && dup(fd) >= 0) have++;
    alarm((unsigned)exit_after);
    for (long i = 1; i < procs; i++) {
        pid_t pid = fork();
        if (pid == 0) { alarm((unsigned)exit_after); for (;;) pause(); }
        if (pid < 0) { fprintf(stderr, "fd_bloat: fork: %s\n", strerror(errno)); return 2; }
    }
    if (ready) {
        char comm[17] = "";
        prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
        FILE *f = fopen(ready, "a");
        if (!f) return 2;
        fprintf(f, "%d %s %ld\n", getpid(), comm, have);
        fclose(f);
    }
    for (;;) pause();
}
