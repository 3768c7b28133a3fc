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

#include "attack.h"

static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
    (void)sig;
    got_term = 1;
}

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 900, NULL);
    long exit_after = a.exit_after;
    if (!a.hold || !a.ready) die("--hold and --ready are required", EINVAL);
    if (open(a.hold, O_RDWR) < 0) die(a.hold, errno);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    write_ready(a.ready);
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
