// A multi-threaded program that forks, as a DataLoader-style worker pool does: two threads allocate and
// free device and pinned memory while the main thread forks 20 times. Each child (under a 10 s alarm)
// frees a pinned block and allocates device memory, which CUDA does not allow in a forked child: the
// calls must answer (an error), never hang, natively and under the interposer. Prints one line; exit
// status 1 if a child hung or died.
#include <cuda_runtime.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <thread>
#include <unistd.h>
#include <sys/wait.h>

static std::atomic<bool> stop{false};
static std::atomic<long> ops{0};

static void churn() {
  while (!stop.load()) {
    void *d = nullptr, *h = nullptr;
    if (cudaMalloc(&d, 1 << 16) == cudaSuccess)
      cudaFree(d);
    if (cudaMallocHost(&h, 4096) == cudaSuccess)
      cudaFreeHost(h);
    ops++;
  }
}

int main() {
  void *kept = nullptr;
  if (cudaMallocHost(&kept, 4096) != cudaSuccess)
    return 2;
  std::thread a(churn), b(churn);
  int hung = 0, died = 0, answered = 0;
  for (int k = 0; k < 20; k++) {
    while (ops.load() < 50L * (k + 1))
      std::this_thread::yield();
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(10);
      cudaFreeHost(kept);  // the parent's pinned block: an error, or a free; never a wait
      void *d = nullptr;
      cudaMalloc(&d, 1 << 20);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      hung++;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      died++;
    else
      answered++;
  }
  stop = true;
  a.join();
  b.join();
  cudaFreeHost(kept);
  printf("fork: 20 children: %d answered, %d hung, %d died\n", answered, hung, died);
  return hung || died ? 1 : 0;
}
