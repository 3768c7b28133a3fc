/* attack.h: what the lab's attack programs share (each includes it once): a one-line error
 * and exit 2, the ready line "<pid> <comm>\n" appended to --ready FILE, and the options each
 * takes: --hold PATH (or a bare PATH), --ready FILE, --exit-after S. */
#ifndef ATTACK_H
#define ATTACK_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

struct attack_args {
    const char *hold, *ready;
    long exit_after;
};

static void die(const char *what, int err)
{
    char comm[17] = "attack";
    prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
    fprintf(stderr, "%s: %.200s: %s\n", comm, what, strerror(err));
    exit(2);
}

/* The common options; `extra` takes a program's own (returns 1 when it took argv[*i], with
 * *i moved past its value), or NULL. "--" ends the options; an unknown one is an error. */
static struct attack_args attack_parse(int argc, char **argv, long exit_after,
                                       int (*extra)(int argc, char **argv, int *i))
{
    struct attack_args a = {NULL, NULL, exit_after};
    for (int i = 1; i < argc; i++) {
        if (extra && extra(argc, argv, &i)) continue;
        if (!strcmp(argv[i], "--")) break;
        if (argv[i][0] != '-') { a.hold = argv[i]; continue; }
        if (i + 1 >= argc) die(argv[i], EINVAL);
        if (!strcmp(argv[i], "--hold")) a.hold = argv[++i];
        else if (!strcmp(argv[i], "--ready")) a.ready = argv[++i];
        else if (!strcmp(argv[i], "--exit-after")) a.exit_after = atol(argv[++i]);
        else die(argv[i], EINVAL);
    }
    return a;
}

/* "<pid> <comm>\n" appended to `ready` (nothing without one): the test waits for it. */
static void write_ready(const char *ready)
{
    if (!ready) return;
    char comm[17] = "";
    prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
    FILE *f = fopen(ready, "a");
    if (!f) die(ready, errno);
    fprintf(f, "%d %s\n", (int)getpid(), comm);
    fclose(f);
}
#endif
