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
    int sv[2], fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0 || socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) < 0) {
        fprintf(stderr, "scm_inflight: %s: %s\n", path ? path : "no PATH", strerror(errno));
        return 2;
    }
    char byte = 'x', cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof cbuf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(sv[0], &msg, 0) < 0) {
        fprintf(stderr, "scm_inflight: sendmsg: %s\n", strerror(errno));
        return 2;
    }
    close(fd); /* the file is now only in the message */
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
