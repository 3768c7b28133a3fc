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

#include "attack.h"

#define SYS_io_uring_setup_ 425
#define SYS_io_uring_register_ 427
#define IORING_REGISTER_FILES_ 2

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 3600, NULL);
    const char *path = a.hold;
    if (!path) die("a PATH is required", EINVAL);
    int fd = open(path, O_RDWR);
    if (fd < 0) fd = open(path, O_RDONLY);
    if (fd < 0) die(path, errno);
    unsigned char params[120]; /* struct io_uring_params, zeroed: the kernel fills it */
    memset(params, 0, sizeof params);
    int ring = (int)syscall(SYS_io_uring_setup_, 4, params);
    if (ring < 0) die("io_uring_setup", errno);
    if (syscall(SYS_io_uring_register_, ring, IORING_REGISTER_FILES_, &fd, 1) < 0)
        die("io_uring_register", errno);
    close(fd); /* from now on only the ring holds the file */
    write_ready(a.ready);
    alarm((unsigned)a.exit_after);
    for (;;) pause();
}
