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

#include "attack.h"

static long n = 1000, depth = 16;

static int own_option(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) return 0;
    if (!strcmp(argv[*i], "--maps")) n = atol(argv[++*i]);
    else if (!strcmp(argv[*i], "--depth")) depth = atol(argv[++*i]);
    else return 0;
    return 1;
}

int main(int argc, char **argv)
{
    const char *top = "/tmp/maps-bloat";
    struct attack_args a = attack_parse(argc, argv, 3600, own_option);
    char name[251];
    memset(name, '\n', 250);
    name[250] = 0;
    mkdir(top, 0755);
    if (chdir(top) < 0) die(top, errno);
    for (long d = 0; d < depth; d++) {
        if (mkdir(name, 0755) < 0 && errno != EEXIST) die("mkdir", errno);
        if (chdir(name) < 0) die("chdir", errno);
    }
    int fd = open("f", O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, 4096) < 0) die("file", errno);
    for (long i = 0; i < n; i++)
        if (mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) die("mmap", errno);
    close(fd);
    write_ready(a.ready);
    alarm((unsigned)a.exit_after);
    for (;;) pause();
}
