/* uring_holder PATH --ready FILE [--exit-after S]: open PATH, register it with an io_uring
 * ring as a fixed file (IORING_REGISTER_FILES), close the fd: the device stays open, held by
 * the ring only, in no fd table. Raw system calls, no liburing. SIGTERM ends it.
 * The attack of issue 26 ("holders without a plain fd"). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SYS_io_uring_setup_ 425
#define SYS_io_uring_register_ 427
#define IORING_REGISTER_FILES_ 2

static void die(const char *what)
{
    fprintf(stderr, "uring_holder: %s: %s\n", what, strerror(errno));
    exit(2);
}

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
    if (!path) { fprintf(stderr, "usage: uring_holder PATH --ready FILE\n"); return 2; }
    int fd = open(path, O_RDWR);
    if (fd < 0) fd = open(path, O_RDONLY);
    if (fd < 0) die(path);
    unsigned char params[120]; /* struct io_uring_params, zeroed: the kernel fills it */
    memset(params, 0, sizeof params);
    int ring = (int)syscall(SYS_io_uring_setup_, 4, params);
    if (ring < 0) die("io_uring_setup");
    if (syscall(SYS_io_uring_register_, ring, IORING_REGISTER_FILES_, &fd, 1) < 0)
        die("io_uring_register");
    close(fd); /* from now on only the ring holds the file */
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
