/* forkstorm: a holder that answers every SIGTERM with two children, then exits.
 * Build: gcc -static -O2 -Wall -o forkstorm forkstorm.c
 * forkstorm --hold PATH --ready FILE [--exit-after S]
 * Opens PATH and waits. On SIGTERM it forks two children, which inherit the open fd and the
 * same behaviour, and exits: asked to stop, it doubles. Only SIGKILL ends one for good. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
    (void)sig;
    got_term = 1;
}

static void die(const char *what, int err)
{
    fprintf(stderr, "forkstorm: %s: %s\n", what, strerror(err));
    exit(2);
}

int main(int argc, char **argv)
{
    const char *hold = NULL, *ready = NULL;
    long exit_after = 900;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hold") && i + 1 < argc) hold = argv[++i];
        else if (!strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
        else if (!strcmp(argv[i], "--exit-after") && i + 1 < argc) exit_after = atol(argv[++i]);
        else if (!strcmp(argv[i], "--")) break;
        else die(argv[i], EINVAL);
    }
    if (!hold || !ready) die("--hold and --ready are required", EINVAL);
    if (open(hold, O_RDWR) < 0) die(hold, errno);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    int rfd = open(ready, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (rfd < 0) die(ready, errno);
    dprintf(rfd, "%d forkstorm\n", (int)getpid());
    close(rfd);
    alarm((unsigned)exit_after);  /* SIGALRM's default ends it; not inherited: re-armed */
    for (;;) {
        pause();
        if (!got_term) continue;
        for (int i = 0; i < 2; i++) {
            pid_t pid = fork();
            if (pid == 0) {
                got_term = 0;
                alarm((unsigned)exit_after);
                break;
            }
        }
        if (got_term) _exit(0);
    }
}
