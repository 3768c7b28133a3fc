/* hideout PATH --mode MODE --ready FILE [--exit-after S]: keep PATH open where no fd table
 * of the process's leader shows it (issue 39, trust round three). Raw system calls, no
 * liburing. SIGTERM ends it (default action).
 *   own-table  a thread unshares its fd table (unshare(CLONE_FILES)) and opens PATH there;
 *              the leader's /proc/PID/fd never shows it.
 *   ring-map   PATH is registered with an io_uring ring as a fixed file, the ring fd is
 *              registered with IORING_REGISTER_RING_FDS and closed: the ring lives on in its
 *              SQ ring mapping only.
 *   chroot     a plain file is put at PATH inside /tmp/hideout-jail, PATH is registered with a
 *              ring as a fixed file and closed, and the process chroots into the jail: PATH
 *              looked up in its root is the plain file (the ready line is written just
 *              before the chroot).
 *   poll       PATH is opened and flock()ed (LOCK_EX: /proc/locks lists it while the open file
 *              lives), an IORING_OP_POLL_ADD on it is left in flight (events POLLPRI|POLLMSG,
 *              which no lab node raises; the holder dies if the request completed), and
 *              PATH's fd is closed: the request alone holds the file, the ring fd stays.
 *              The ring's fdinfo lists the request under "PollList:" without naming it.
 *   stacked    PATH is bind-mounted at /tmp/hideout-gpu/NAME (NAME: PATH's last component),
 *              opened there, flock()ed, registered as a fixed file and closed; then a tmpfs
 *              is mounted over /tmp/hideout-gpu, with a plain file NAME in it: the ring lists
 *              /tmp/hideout-gpu/NAME, which now leads to the plain file.
 *   detached   PATH's directory is bind-mounted (recursively) at /tmp/hideout-det, PATH
 *              opened there, flock()ed, registered and closed; the bind is detached
 *              (umount -l) and a plain file /NAME made: the ring lists the path from the
 *              detached tree's top, /NAME, which now leads to the plain file. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/file.h>
#include <libgen.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "attack.h"

#define SYS_io_uring_setup_ 425
#define SYS_io_uring_enter_ 426
#define SYS_io_uring_register_ 427
#define IORING_REGISTER_FILES_ 2
#define IORING_REGISTER_RING_FDS_ 20
#define JAIL "/tmp/hideout-jail"

static const char *mode = "own-table";
static const char *path;
static volatile int opened;

static int mode_opt(int argc, char **argv, int *i)
{
    if (strcmp(argv[*i], "--mode") || *i + 1 >= argc) return 0;
    mode = argv[++*i];
    return 1;
}

static int open_at_path(const char *at)
{
    int fd = open(at, O_RDWR);
    if (fd < 0) fd = open(at, O_RDONLY);
    if (fd < 0) die(at, errno);
    return fd;
}

static int open_node(void)
{
    return open_at_path(path);
}

static void plain_file(const char *at)
{
    int p = open(at, O_CREAT | O_WRONLY, 0644);
    if (p < 0) die(at, errno);
    close(p);
}

static void *own_table(void *arg)
{
    (void)arg;
    if (unshare(CLONE_FILES) < 0) die("unshare(CLONE_FILES)", errno);
    open_node();
    opened = 1;
    for (;;) pause();
    return NULL;
}

/* A ring (its SQ ring mapped), AT registered as fixed file 0 (flock()ed first when LOCK),
 * AT's fd closed. */
static int ring_holding_at(const char *at, int lock)
{
    unsigned params[30]; /* struct io_uring_params: 120 bytes, the kernel fills it */
    memset(params, 0, sizeof params);
    int ring = (int)syscall(SYS_io_uring_setup_, 4, params);
    if (ring < 0) die("io_uring_setup", errno);
    /* sq_off.array is params[10] (after 2 entries, flags, cpu, idle, features, wq_fd, resv[3],
     * then sq_off: head tail ring_mask ring_entries flags dropped array) */
    unsigned sq_entries = params[0], array = params[10 + 6];
    size_t len = array + sq_entries * sizeof(unsigned);
    if (mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, 0) == MAP_FAILED)
        die("mmap of the SQ ring", errno);
    int fd = open_at_path(at);
    if (lock && flock(fd, LOCK_EX | LOCK_NB) < 0) die("flock", errno);
    if (syscall(SYS_io_uring_register_, ring, IORING_REGISTER_FILES_, &fd, 1) < 0)
        die("IORING_REGISTER_FILES", errno);
    close(fd);
    return ring;
}

/* A ring (its SQ ring mapped), PATH registered with it as fixed file 0, PATH's fd closed. */
static int ring_holding(void)
{
    return ring_holding_at(path, 0);
}

/* A ring with one IORING_OP_POLL_ADD on PATH in flight, PATH flock()ed and its fd closed. */
static int ring_polling(void)
{
    unsigned params[30]; /* struct io_uring_params; the offsets as in ring_holding */
    memset(params, 0, sizeof params);
    int ring = (int)syscall(SYS_io_uring_setup_, 4, params);
    if (ring < 0) die("io_uring_setup", errno);
    unsigned sq_entries = params[0], cq_entries = params[1];
    size_t sq_len = params[16] + sq_entries * sizeof(unsigned);
    size_t cq_len = params[25] + cq_entries * 16;
    size_t len = sq_len > cq_len ? sq_len : cq_len; /* IORING_FEAT_SINGLE_MMAP */
    char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, 0);
    if (r == MAP_FAILED) die("mmap of the rings", errno);
    unsigned char *sqes = mmap(NULL, sq_entries * 64, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_POPULATE, ring, 0x10000000);
    if (sqes == MAP_FAILED) die("mmap of the SQEs", errno);
    int fd = open_node();
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) die("flock", errno);
    memset(sqes, 0, 64);
    sqes[0] = 6;                                   /* IORING_OP_POLL_ADD */
    memcpy(sqes + 4, &fd, 4);                      /* fd */
    unsigned events = POLLPRI | POLLMSG;           /* poll32_events, at 28 */
    memcpy(sqes + 28, &events, 4);
    unsigned long long user_data = 39;
    memcpy(sqes + 32, &user_data, 8);
    volatile unsigned *tail = (unsigned *)(r + params[11]);
    unsigned *array = (unsigned *)(r + params[16]);
    array[*tail & *(unsigned *)(r + params[12])] = 0;
    __atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
    if (syscall(SYS_io_uring_enter_, ring, 1, 0, 0, NULL, 0) != 1) die("io_uring_enter", errno);
    usleep(100000);
    volatile unsigned *cq_head = (unsigned *)(r + params[20]);
    volatile unsigned *cq_tail = (unsigned *)(r + params[21]);
    if (*cq_tail != *cq_head) {
        int res;
        memcpy(&res, r + params[25] + 8, 4); /* the first CQE: user_data, res, flags */
        die("the poll completed at once (the node cannot be polled)", res < 0 ? -res : EINVAL);
    }
    close(fd); /* from now on only the request in flight holds the file (and its lock) */
    return ring;
}

int main(int argc, char **argv)
{
    struct attack_args a = attack_parse(argc, argv, 3600, mode_opt);
    path = a.hold;
    if (!path) die("a PATH is required", EINVAL);
    if (!strcmp(mode, "own-table")) {
        pthread_t t;
        if (pthread_create(&t, NULL, own_table, NULL)) die("pthread_create", EAGAIN);
        while (!opened) usleep(1000);
    } else if (!strcmp(mode, "ring-map")) {
        int ring = ring_holding();
        struct { unsigned offset, resv; unsigned long long data; } up = {~0U, 0, (unsigned)ring};
        if (syscall(SYS_io_uring_register_, ring, IORING_REGISTER_RING_FDS_, &up, 1) < 0)
            die("IORING_REGISTER_RING_FDS", errno);
        close(ring); /* from now on the ring is in no fd table: its mapping keeps it */
    } else if (!strcmp(mode, "poll")) {
        ring_polling();
    } else if (!strcmp(mode, "stacked")) {
        char copy[4096], at[4200];
        snprintf(copy, sizeof copy, "%s", path);
        const char *name = basename(copy);
        mkdir("/tmp/hideout-gpu", 0755);
        snprintf(at, sizeof at, "/tmp/hideout-gpu/%s", name);
        plain_file(at);
        if (mount(path, at, NULL, MS_BIND, NULL) < 0) die("mount --bind", errno);
        ring_holding_at(at, 1);
        if (mount("tmpfs", "/tmp/hideout-gpu", "tmpfs", 0, NULL) < 0) die("mount tmpfs", errno);
        plain_file(at);
    } else if (!strcmp(mode, "detached")) {
        char copy[4096], dir[4096], at[4200], decoy[4200];
        snprintf(copy, sizeof copy, "%s", path);
        snprintf(dir, sizeof dir, "%s", dirname(copy));
        snprintf(copy, sizeof copy, "%s", path);
        const char *name = basename(copy);
        mkdir("/tmp/hideout-det", 0755);
        if (mount(dir, "/tmp/hideout-det", NULL, MS_BIND | MS_REC, NULL) < 0)
            die("mount --rbind", errno);
        snprintf(at, sizeof at, "/tmp/hideout-det/%s", name);
        ring_holding_at(at, 1);
        if (umount2("/tmp/hideout-det", MNT_DETACH) < 0) die("umount -l", errno);
        snprintf(decoy, sizeof decoy, "/%s", name);
        plain_file(decoy);
    } else if (!strcmp(mode, "chroot")) {
        char plain[4096];
        snprintf(plain, sizeof plain, JAIL "%s", path);
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", plain);
        for (char *s = dir + 1; *s; s++)
            if (*s == '/') { *s = 0; mkdir(dir, 0755); *s = '/'; }
        int p = open(plain, O_CREAT | O_WRONLY, 0644);
        if (p < 0) die(plain, errno);
        close(p);
        ring_holding(); /* the ring fd stays: its fdinfo lists PATH */
        write_ready(a.ready); /* by its path, before the chroot hides it */
        if (chroot(JAIL) < 0 || chdir("/") < 0) die("chroot", errno);
        alarm((unsigned)a.exit_after);
        for (;;) pause();
    } else {
        die(mode, EINVAL);
    }
    write_ready(a.ready);
    alarm((unsigned)a.exit_after);
    for (;;) pause();
}
