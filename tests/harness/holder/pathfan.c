/* pathfan: many holders, each holding many GPU device paths at long paths (report bloat).
 * Build: gcc -static -O2 -Wall -std=gnu11 -o pathfan pathfan.c
 *
 *   pathfan --node PATH --paths N --children M [--thread-cgroup DIR] --ready FILE
 *           --exit-after S [-- ARG...]
 *
 * Makes a directory below /tmp whose path is about 3,800 characters long, bind-mounts the
 * device node PATH at N files there (needs CAP_SYS_ADMIN in the container), opens each one
 * (O_RDWR) and keeps the fds, then forks M children that inherit them: M + 1 processes each
 * holding N device paths of ~3,800 characters. With --thread-cgroup, the process (before it
 * forks) moves itself into the cgroup DIR (as the container sees it), so every holder lives
 * there. Writes "<pid> <comm>" to FILE once every child is forked; every process exits on
 * SIGTERM (the default action) or after S seconds. ARGs after "--" are not read: they make
 * its argv (and its children's) as long as a test wants. Errors: "pathfan: <what>: <strerror>" on
 * stderr and exit status 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEVELS 15
#define NAME_LEN 250

static void die(const char *what, int err)
{
    fprintf(stderr, "pathfan: %.200s: %s\n", what, strerror(err));
    exit(2);
}

static long num(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 0) die(s, EINVAL);
    return v;
}

int main(int argc, char **argv)
{
    const char *node = NULL, *ready = NULL, *cgroup = NULL;
    long paths = 64, children = 0, exit_after = 3600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (i + 1 >= argc) die(a, EINVAL);
        if (!strcmp(a, "--node")) node = argv[++i];
        else if (!strcmp(a, "--paths")) paths = num(argv[++i]);
        else if (!strcmp(a, "--children")) children = num(argv[++i]);
        else if (!strcmp(a, "--thread-cgroup")) cgroup = argv[++i];
        else if (!strcmp(a, "--ready")) ready = argv[++i];
        else if (!strcmp(a, "--exit-after")) exit_after = num(argv[++i]);
        else die(a, EINVAL);
    }
    if (!node || !ready) die("--node and --ready are required", EINVAL);

    static char dir[4096];
    int len = snprintf(dir, sizeof dir, "/tmp/pathfan-%d", (int)getpid());
    if (mkdir(dir, 0755) && errno != EEXIST) die(dir, errno);
    for (int l = 0; l < LEVELS; l++) {
        dir[len++] = '/';
        memset(dir + len, 'p' + l % 8, NAME_LEN);
        len += NAME_LEN;
        dir[len] = 0;
        if (mkdir(dir, 0755) && errno != EEXIST) die("mkdir", errno);
    }
    for (long i = 0; i < paths; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/gpu%03ld", dir, i);
        int fd = open(path, O_WRONLY | O_CREAT, 0600);
        if (fd < 0) die("create", errno);
        close(fd);
        if (mount(node, path, NULL, MS_BIND, NULL)) die("mount --bind", errno);
        if (open(path, O_RDWR) < 0) die("open", errno);
    }
    if (cgroup) {
        char procs[4096], pid[32];
        snprintf(procs, sizeof procs, "%s/cgroup.procs", cgroup);
        int fd = open(procs, O_WRONLY);
        if (fd < 0) die(procs, errno);
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (write(fd, pid, n) != n) die(procs, errno);
        close(fd);
    }
    alarm((unsigned)exit_after);
    for (long c = 0; c < children; c++) {
        pid_t p = fork();
        if (p < 0) die("fork", errno);
        if (p == 0) {
            alarm((unsigned)exit_after);
            for (;;) pause();
        }
    }
    char comm[17] = "", line[64];
    prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
    int n = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), comm);
    int fd = open(ready, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, n) != n) die(ready, errno);
    close(fd);
    for (;;) pause();
}
