/* holder: fake GPU workload for pveclean tests.
 * Build: gcc -static -O2 -Wall -o holder holder.c
 * Run it through a symlink named like the process to imitate (comm = symlink name).
 * See tests/lab/holder.py for the option list. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXPATHS 32

static volatile sig_atomic_t got_term, got_chld, got_alrm;
static const char *holds[MAXPATHS], *maps[MAXPATHS];
static int nhold, nmap, nchildren, ignore_term, pidns, thread_holds;
static long term_delay_ms, exit_after = 3600, respawn = -1;
static const char *name, *child_name, *ready;
static sigset_t waitmask; /* mask used while sleeping in sigsuspend */
static time_t deadline;   /* CLOCK_MONOTONIC second at which --exit-after fires */

static void on_sig(int sig)
{
    if (sig == SIGTERM) got_term = 1;
    else if (sig == SIGCHLD) got_chld = 1;
    else if (sig == SIGALRM) got_alrm = 1;
}

static void die(const char *what, int err)
{
    fprintf(stderr, "holder: %s: %s\n", what, strerror(err));
    exit(2);
}

static time_t now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
}

/* (Re)arm the exit-after alarm; alarms are not inherited across fork(). */
static void arm_alarm(void)
{
    time_t left = deadline - now();
    alarm(left > 0 ? (unsigned)left : 1);
}

static void set_comm(const char *n)
{
    if (n) prctl(PR_SET_NAME, (unsigned long)n, 0, 0, 0);
}

static long num(const char *opt, const char *s)
{
    char *end, what[128];
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        snprintf(what, sizeof what, "%s %s", opt, s);
        die(what, EINVAL);
    }
    return v;
}

static void write_ready(void)
{
    char comm[17] = "", line[64];
    int fd, len;
    if (!ready) return;
    prctl(PR_GET_NAME, (unsigned long)comm, 0, 0, 0);
    len = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), comm);
    fd = open(ready, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die(ready, errno);
    if (write(fd, line, len) != len) die(ready, errno);
    close(fd);
}

/* Exit status of a waited-for child, re-encoded as our own exit code. */
static int status_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Sleep until a signal flag is set. */
static void wait_signal(void)
{
    while (!got_term && !got_chld && !got_alrm) sigsuspend(&waitmask);
}

static void graceful_exit(void)
{
    struct timespec ts = {term_delay_ms / 1000, (term_delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
    exit(0);
}

/* Holder loop: hold until SIGTERM (unless ignored) or --exit-after; reap our children. */
static void __attribute__((noreturn)) hold_forever(void)
{
    for (;;) {
        wait_signal();
        if (got_chld) {
            got_chld = 0;
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        }
        if (got_alrm) exit(0);
        if (got_term) graceful_exit();
    }
}

static void *thread_main(void *arg)
{
    struct timespec ts = {0, 50 * 1000000L};
    (void)arg;
    /* wait until the main thread has exited, so --ready means "leader is a zombie" */
    while (1) {
        char path[64], buf[512];
        int fd, n;
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)getpid());
        fd = open(path, O_RDONLY);
        if (fd < 0) break;
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) break;
        buf[n] = 0;
        if (strstr(buf, ") Z ")) break;
        nanosleep(&ts, NULL);
    }
    write_ready();
    hold_forever();
}

/* Open/map everything, fork --children, write --ready, then hold forever. */
static void __attribute__((noreturn)) run_holder(void)
{
    int i, fd, p[2];
    char what[512];

    for (i = 0; i < nhold; i++) {
        fd = open(holds[i], O_RDWR);
        if (fd < 0) fd = open(holds[i], O_RDONLY);
        if (fd < 0) die(holds[i], errno);
    }
    for (i = 0; i < nmap; i++) {
        fd = open(maps[i], O_RDONLY);
        if (fd < 0) die(maps[i], errno);
        if (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
            snprintf(what, sizeof what, "mmap %s", maps[i]);
            die(what, errno);
        }
        close(fd);
    }
    if (nchildren > 0) {
        if (pipe(p) < 0) die("pipe", errno);
        for (i = 0; i < nchildren; i++) {
            pid_t pid = fork();
            if (pid < 0) die("fork", errno);
            if (pid == 0) {
                set_comm(child_name);
                arm_alarm();
                close(p[0]);
                close(p[1]); /* tells the parent this child is set up */
                hold_forever();
            }
        }
        close(p[1]);
        while (read(p[0], what, 1) > 0) {} /* EOF once every child has set up */
        close(p[0]);
    }
    if (thread_holds) {
        /* --thread-holds: a worker thread keeps the fds and mappings, the main thread exits:
         * the leader is a zombie with an empty /proc/PID/fd and maps, the process lives. */
        pthread_t t;
        int err = pthread_create(&t, NULL, thread_main, NULL);
        if (err) die("pthread_create", err);
        pthread_exit(NULL);
    }
    write_ready();
    hold_forever();
}

static pid_t spawn_worker(void)
{
    pid_t pid = fork();
    if (pid < 0) die("fork", errno);
    if (pid == 0) {
        set_comm(child_name);
        arm_alarm();
        run_holder();
    }
    return pid;
}

/* --respawn: hold nothing, keep one worker running, restart it at most `respawn` times. */
static void __attribute__((noreturn)) supervise(void)
{
    pid_t worker = spawn_worker(), pid;
    for (;;) {
        wait_signal();
        if (got_chld) {
            got_chld = 0;
            while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
                if (pid != worker) continue;
                worker = 0;
                if (respawn > 0) {
                    respawn--;
                    worker = spawn_worker();
                }
            }
        }
        if (got_alrm) exit(0);
        if (got_term) graceful_exit();
    }
}

/* Relay for --pidns (outer process and inner init): forward SIGTERM to `child`,
 * reap everything, exit with child's status once it is gone. */
static void __attribute__((noreturn)) relay(pid_t child)
{
    int st;
    pid_t pid;
    struct sigaction sa = {.sa_handler = on_sig};
    sigaction(SIGTERM, &sa, NULL); /* a pidns init only gets signals it handles */
    for (;;) {
        wait_signal();
        if (got_term) {
            got_term = 0;
            kill(child, SIGTERM);
        }
        if (got_chld) {
            got_chld = 0;
            while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
                if (pid == child) exit(status_code(st));
        }
    }
}

static int takes_arg(const char *o)
{
    static const char *const opts[] = {"--hold", "--map", "--name", "--child-name", "--ready",
                                       "--term-delay", "--children", "--respawn", "--exit-after"};
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++)
        if (!strcmp(o, opts[k])) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    int i;
    char what[128];
    struct sigaction sa = {.sa_handler = on_sig};
    sigset_t block;

    for (i = 1; i < argc; i++) {
        const char *o = argv[i], *a = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--"))
            break; /* the rest only decorates the command line (e.g. -m vllm.worker) */
        if (!strcmp(o, "--ignore-term")) {
            ignore_term = 1;
            continue;
        }
        if (!strcmp(o, "--thread-holds")) {
            thread_holds = 1;
            continue;
        }
        if (!strcmp(o, "--pidns")) {
            pidns = 1;
            continue;
        }
        if (takes_arg(o)) {
            if (!a) {
                snprintf(what, sizeof what, "%s: missing argument", o);
                die(what, EINVAL);
            }
            i++;
        }
        if (!strcmp(o, "--hold") || !strcmp(o, "--map")) {
            int is_hold = o[2] == 'h';
            if ((is_hold ? nhold : nmap) >= MAXPATHS) die(o, E2BIG);
            if (is_hold) holds[nhold++] = a;
            else maps[nmap++] = a;
        } else if (!strcmp(o, "--name")) name = a;
        else if (!strcmp(o, "--child-name")) child_name = a;
        else if (!strcmp(o, "--ready")) ready = a;
        else if (!strcmp(o, "--term-delay")) term_delay_ms = num(o, a);
        else if (!strcmp(o, "--children")) nchildren = (int)num(o, a);
        else if (!strcmp(o, "--respawn")) respawn = num(o, a);
        else if (!strcmp(o, "--exit-after")) exit_after = num(o, a);
        else {
            snprintf(what, sizeof what, "unknown option %s", o);
            die(what, EINVAL);
        }
    }

    /* Signals stay blocked except inside sigsuspend(): no races, no busy loop. */
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGCHLD);
    sigdelset(&waitmask, SIGALRM);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    deadline = now() + exit_after;

    if (pidns) {
        pid_t init, holder;
        if (unshare(CLONE_NEWPID) < 0) die("unshare(CLONE_NEWPID)", errno);
        init = fork(); /* PID 1 of the new namespace */
        if (init < 0) die("fork", errno);
        if (init > 0) relay(init);
        holder = fork(); /* PID 2 */
        if (holder < 0) die("fork", errno);
        if (holder > 0) relay(holder);
    }

    if (ignore_term) signal(SIGTERM, SIG_IGN);
    else sigaction(SIGTERM, &sa, NULL);
    set_comm(name);
    arm_alarm();
    if (respawn >= 0) supervise();
    run_holder();
}
