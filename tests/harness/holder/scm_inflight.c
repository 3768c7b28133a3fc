/* scm_inflight PATH --ready FILE [--exit-after S]: open PATH, send the fd over a unix socket
 * pair with SCM_RIGHTS, never receive it, and close the fd: the open file is then "in
 * flight", queued in the socket's receive queue, in no process's fd table. Both ends of the
 * pair stay open. SIGTERM ends it. Shows what the fd scan cannot see (docs/security.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "attack.h"

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 3600, NULL);
    const char *path = a.hold;
    int sv[2], fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0 || socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) < 0)
        die(path ? path : "a PATH is required", path ? errno : EINVAL);
    char byte = 'x', cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof cbuf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(sv[0], &msg, 0) < 0) die("sendmsg", errno);
    close(fd); /* the file is now only in the message */
    write_ready(a.ready);
    alarm((unsigned)a.exit_after);
    for (;;) pause();
}
