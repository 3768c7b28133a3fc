/* named_init: a container's PID 1 that names itself, as a tenant's own init may.
 * Build: gcc -static -O2 -Wall -o named_init named_init.c
 * Usage (lxc.init.cmd): named_init NAME [PATH]
 *   NAME  its comm, set with prctl(PR_SET_NAME); C escapes \f \t \n \r \v \\ \xHH are decoded
 *         (an lxc config line cannot hold those bytes raw)
 *   PATH  opened and kept (a GPU node: PID 1 is then a GPU holder)
 * It reaps orphans like any init and exits on SIGTERM, SIGINT, SIGUSR1 (lxc's halt signal
 * in the lab) or SIGPWR, or by itself after an hour. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_sig(int sig)
{
    if (sig != SIGCHLD) stop = 1;
}

static int hex(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void unescape(const char *in, char *out, size_t size)
{
    size_t n = 0;
    while (*in && n + 1 < size) {
        char c = *in++;
        if (c == '\\' && *in) {
            char e = *in++;
            switch (e) {
            case 'f': c = '\f'; break;
            case 't': c = '\t'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 'v': c = '\v'; break;
            case 'x':
                if (hex(in[0]) >= 0 && hex(in[1]) >= 0) {
                    c = (char)(hex(in[0]) * 16 + hex(in[1]));
                    in += 2;
                    break;
                }
                /* fall through */
            default: c = e;
            }
        }
        out[n++] = c;
    }
    out[n] = '\0';
}

int main(int argc, char **argv)
{
    char name[64];
    static const int sigs[] = {SIGTERM, SIGINT, SIGUSR1, SIGPWR, SIGALRM, SIGCHLD};
    struct sigaction sa = {.sa_handler = on_sig};
    sigset_t block, waitmask;

    /* Signals stay blocked except inside sigsuspend(): none is missed between checks. */
    sigemptyset(&block);
    for (size_t k = 0; k < sizeof sigs / sizeof *sigs; k++) {
        sigaddset(&block, sigs[k]);
        sigaction(sigs[k], &sa, NULL);
    }
    sigprocmask(SIG_BLOCK, &block, &waitmask);
    if (argc > 1) {
        unescape(argv[1], name, sizeof name);
        prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
    }
    if (argc > 2 && open(argv[2], O_RDWR) < 0 && open(argv[2], O_RDONLY) < 0)
        return 2;
    alarm(3600);
    while (!stop) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (!stop) sigsuspend(&waitmask);
    }
    return 0;
}
