/* maps_bloat --maps N --depth D --ready FILE [--exit-after S]: a file whose path is D
 * directories of 250 newlines each (a newline shows as \012 in /proc/PID/maps: four bytes),
 * mapped N times, each mapping a VMA of its own (every one at offset 0: none merges). With
 * D = 16 and N = 65,000 its maps is about 1 GB of text. SIGTERM ends it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "maps_bloat: %s: %s\n", what, strerror(errno));
    exit(2);
}

int main(int argc, char **argv)
{
    const char *ready = NULL, *top = "/tmp/maps-bloat";
    long n = 1000, depth = 16, exit_after = 3600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
        else if (!strcmp(argv[i], "--maps") && i + 1 < argc) n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) depth = atol(argv[++i]);
        else if (!strcmp(argv[i], "--exit-after") && i + 1 < argc) exit_after = atol(argv[++i]);
    }
    char name[251];
    memset(name, '\n', 250);
    name[250] = 0;
    mkdir(top, 0755);
    if (chdir(top) < 0) die(top);
    for (long d = 0; d < depth; d++) {
        if (mkdir(name, 0755) < 0 && errno != EEXIST) die("mkdir");
        if (chdir(name) < 0) die("chdir");
    }
    int fd = open("f", O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, 4096) < 0) die("file");
    for (long i = 0; i < n; i++)
        if (mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) die("mmap");
    close(fd);
    if (ready) {
        char comm[17] = "";
        prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
        FILE *f = fopen(ready, "a");
        if (!f) die(ready);
        fprintf(f, "%d %s\n", getpid(), comm);
        fclose(f);
    }
    alarm((unsigned)exit_after);
    for (;;) pause();
}
