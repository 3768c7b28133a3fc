/* hopper: a GPU holder that hops from fresh cgroup to fresh cgroup inside its container.
 * Build: gcc -static -O2 -Wall -o hopper hopper.c
 * hopper --hold PATH --ready FILE [--exit-after S]
 * Opens PATH, mounts the container's cgroup2 view at /tmp/hopper-cg (its root is the
 * container's own cgroup namespace root), appends "<pid> hopper\n" to FILE, then forever:
 * mkdir a new cgroup, move itself there, rmdir the one it left. A walk that lists the tree's
 * cgroups and then reads each one's processes finds it in none: it is always in a cgroup
 * made after the walk listed its parent.
 * --late FILE (issue 39): hop without PATH open until FILE exists, then open it and hop on:
 * idle when discovery reads it, a holder during the grace. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attack.h"

#define BASE "/tmp/hopper-cg"

static const char *late; /* --late FILE: open PATH only once FILE exists */

static int late_opt(int argc, char **argv, int *i)
{
    if (strcmp(argv[*i], "--late") || *i + 1 >= argc) return 0;
    late = argv[++*i];
    return 1;
}

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 900, late_opt);
    long exit_after = a.exit_after;
    if (!a.hold || !a.ready) die("--hold and --ready are required", EINVAL);
    if (!late && open(a.hold, O_RDWR) < 0) die(a.hold, errno);
    mkdir(BASE, 0755);
    if (mount("none", BASE, "cgroup2", 0, NULL) < 0 && errno != EBUSY) die("mount cgroup2", errno);
    char cur[64] = "", next[64], procs[96];
    write_ready(a.ready);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned long n = 0;; n++) {
        snprintf(next, sizeof next, BASE "/hop-%d-%lu", (int)getpid(), n);
        if (mkdir(next, 0755) < 0) continue;
        snprintf(procs, sizeof procs, "%s/cgroup.procs", next);
        int fd = open(procs, O_WRONLY);
        if (fd >= 0) {
            dprintf(fd, "%d", (int)getpid());
            close(fd);
        }
        if (cur[0]) rmdir(cur);
        memcpy(cur, next, sizeof cur);
        if (late && access(late, F_OK) == 0) {
            if (open(a.hold, O_RDWR) < 0) die(a.hold, errno);
            late = NULL;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > exit_after) _exit(0);
    }
}
