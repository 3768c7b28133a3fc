/* relay: an fd relay that forks and exits faster than a walk of the cgroup tree.
 * Build: gcc -static -O2 -Wall -o relay relay.c
 * relay --hold PATH --ready FILE [--exit-after S]
 * Opens PATH, appends "<pid> relay\n" to FILE, then forever: fork; the child (which inherits
 * the open fd) goes on, the parent exits at once. No process of the chain lives longer than
 * one fork, so a walk that lists a cgroup's processes and then reads their /proc files finds
 * each one gone; only a tree that holds still shows the holder. SIGTERM: default (dies). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what, int err)
{
    fprintf(stderr, "relay: %s: %s\n", what, strerror(err));
    exit(2);
}

int main(int argc, char **argv)
{
    const char *hold = NULL, *ready = NULL;
    long exit_after = 900;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hold") && i + 1 < argc) hold = argv[++i];
        else if (!strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
        else if (!strcmp(argv[i], "--exit-after") && i + 1 < argc) exit_after = atol(argv[++i]);
        else if (!strcmp(argv[i], "--")) break;
        else die(argv[i], EINVAL);
    }
    if (!hold || !ready) die("--hold and --ready are required", EINVAL);
    if (open(hold, O_RDWR) < 0) die(hold, errno);
    int rfd = open(ready, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (rfd < 0) die(ready, errno);
    dprintf(rfd, "%d relay\n", (int)getpid());
    close(rfd);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pid_t pid = fork();
        if (pid < 0) {
            usleep(1000);  /* out of processes for a moment: try again */
            continue;
        }
        if (pid > 0) _exit(0);  /* the parent goes; the child carries the fd on */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > exit_after) _exit(0);
    }
}
