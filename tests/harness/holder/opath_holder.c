/* opath_holder PATH --ready FILE [--exit-after S]: keep an O_PATH fd of PATH, which names
 * the file without opening it (no open() of the device ever runs): not a GPU holder.
 * SIGTERM ends it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *path = NULL, *ready = NULL;
    long exit_after = 3600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
        else if (!strcmp(argv[i], "--exit-after") && i + 1 < argc) exit_after = atol(argv[++i]);
        else if (!strcmp(argv[i], "--")) break;
        else path = argv[i];
    }
    if (!path || open(path, O_PATH) < 0) {
        fprintf(stderr, "opath_holder: %s: %s\n", path ? path : "no PATH", strerror(errno));
        return 2;
    }
    if (ready) {
        char comm[17] = "";
        prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
        FILE *f = fopen(ready, "a");
        if (!f) return 2;
        fprintf(f, "%d %s\n", getpid(), comm);
        fclose(f);
    }
    alarm((unsigned)exit_after);
    for (;;) pause();
}
