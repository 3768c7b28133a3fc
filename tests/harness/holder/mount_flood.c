/* mount_flood --count N [DIR]: make DIR/<15 directories of 250 'x'> and bind-mount that
 * directory onto itself N times, so that the mount namespace's mountinfo grows by about
 * 7.6 KB per mount (its root and mount point, each ~3.8 KB); then exit. N = 600 passes
 * 4 MiB: a mount made after it is past a 4 MiB read of mountinfo. The namespace's mounts
 * are made private first (else each bind onto itself would propagate and double). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *top = "/tmp/mount-flood";
    long count = 600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atol(argv[++i]);
        else top = argv[i];
    }
    static char path[4096];
    char name[251];
    memset(name, 'x', 250);
    name[250] = 0;
    int len = snprintf(path, sizeof path, "%s", top);
    mkdir(top, 0755);
    for (int d = 0; d < 15; d++) {
        len += snprintf(path + len, sizeof path - len, "/%s", name);
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            fprintf(stderr, "mount_flood: mkdir: %s\n", strerror(errno));
            return 2;
        }
    }
    /* private first: a bind onto itself of a shared mount propagates, doubling each time */
    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    for (long i = 0; i < count; i++)
        if (mount(path, path, NULL, MS_BIND, NULL) < 0) {
            fprintf(stderr, "mount_flood: mount %ld: %s\n", i, strerror(errno));
            return 2;
        }
    return 0;
}
