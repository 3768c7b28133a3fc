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

#include "attack.h"

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 900, NULL);
    long exit_after = a.exit_after;
    if (!a.hold || !a.ready) die("--hold and --ready are required", EINVAL);
    if (open(a.hold, O_RDWR) < 0) die(a.hold, errno);
    write_ready(a.ready);
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
