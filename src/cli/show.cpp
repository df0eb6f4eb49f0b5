// `torchcap show FILE --svg OUT.svg` and `--dot`: the graph's picture
// (graphviz_picture, src/graph/dot.cpp), rendered by Graphviz's dot, with
// what was drawn and how long it took.
#include <torchcap/error.h>
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>

#include "cli/commands.h"
#include "serialize/temp_files.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace torchcap::cli {
namespace {

std::string seconds_str(double ms) {
  char buf[32];
  if (ms < 100) {
    std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", ms / 1e3);
  }
  return buf;
}

// What the command can do about the picture it chose.
std::string hints(const DotPicture& p) {
  if (p.module_level()) return "; --all-nodes draws every node, --depth N another depth";
  if (p.over_budget) return "; beyond the budget";
  return "";
}

void sleep_ms(long ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// Runs `dot -Tsvg` with `source` on its standard input and its standard
// output on `fd`; waits for it, saying on a terminal how long it has been
// running; kills it after `timeout` seconds (0: never).
void run_dot(const std::string& source, int fd, const std::string& svg_path, const DotPicture& picture,
             double timeout) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw Error("cannot start Graphviz: no pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::vector<char*> argv = {const_cast<char*>("dot"), const_cast<char*>("-Tsvg"), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, "dot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[0]);
  if (rc != 0) {
    ::close(pipe_fds[1]);
    throw Error("cannot run Graphviz's dot to render '" + svg_path + "' (is graphviz installed?)");
  }
  // dot reads all of its input before it lays anything out; if it stops
  // early (bad input) the write fails with EPIPE rather than killing us.
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);
  detail::write_fully(pipe_fds[1], source.data(), source.size());
  ::sigaction(SIGPIPE, &previous, nullptr);
  ::close(pipe_fds[1]);

  Progress progress;
  const std::string what = "rendering " + svg_path + " with Graphviz (" + std::to_string(picture.drawn) + " boxes)";
  progress.step(what);
  const auto t0 = Clock::now();
  long shown = 0, pause = 2;
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) throw Error("lost Graphviz's dot while rendering '" + svg_path + "'");
    const double ms = ms_since(t0);
    if (timeout > 0 && ms >= timeout * 1e3) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw Error("Graphviz did not finish drawing '" + svg_path + "' in --timeout " + seconds_str(timeout * 1e3) +
                  " (" + std::to_string(picture.drawn) +
                  " boxes): draw fewer (--depth N, --budget N, without --all-nodes) or allow longer");
    }
    if (static_cast<long>(ms / 1e3) > shown) {
      shown = static_cast<long>(ms / 1e3);
      progress.step(what + ", " + std::to_string(shown) + " s");
    }
    // Small pictures take milliseconds; large ones are not polled often.
    sleep_ms(pause);
    pause = std::min(pause * 2, 100L);
  }
  progress.done();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error("Graphviz's dot failed to render '" + svg_path + "'");
  }
}

}  // namespace

void add_picture_options(CLI::App& show, PictureRequest& request) {
  auto* all = show.add_flag("--all-nodes", request.options.all_nodes,
                            "with --svg or --dot: draw every node, however many (above the budget a graph "
                            "is drawn one box per module)");
  show.add_option("--depth", request.options.depth,
                  "with --svg or --dot: draw the modules at this depth as boxes (1: the model's children; "
                  "default: the deepest that fits the budget)")
      ->check(CLI::Range(1, 1000))
      ->excludes(all);
  show.add_option("--budget", request.options.budget,
                  "with --svg or --dot: boxes a picture may have before it is drawn by module (default " +
                      std::to_string(DotOptions().budget) + ")")
      ->check(CLI::Range(1, 1000000000));
  show.add_option("--timeout", request.timeout, "with --svg: stop Graphviz after this many seconds (default: no limit)")
      ->check(CLI::PositiveNumber);
}

void check_picture_options(const CLI::App& show, const PictureRequest& request, bool memory) {
  const bool picture_options = show.count("--all-nodes") + show.count("--depth") + show.count("--budget") > 0;
  if (picture_options && memory) throw Error("--all-nodes, --depth and --budget draw a graph, not --memory's plan");
  if (picture_options && request.svg.empty() && !request.dot) {
    throw Error("--all-nodes, --depth and --budget choose what --svg or --dot draws; give one of them");
  }
  if (show.count("--timeout") > 0 && request.svg.empty()) throw Error("--timeout bounds --svg's rendering; give --svg");
}

void show_picture(const GraphModule& gm, const PictureRequest& request, bool other_output) {
  const DotPicture picture = graphviz_picture(gm, request.options);
  if (!request.svg.empty()) {
    if (picture.over_budget) {
      // Said before the wait, on stderr whatever the terminal.
      std::cerr << "drawing " << picture.drawn << " boxes, " << picture.width
                << " side by side at the widest, beyond the budget (" << request.options.budget << " boxes, "
                << request.options.max_width << " wide): Graphviz may take minutes (--timeout SECONDS bounds it)\n";
    }
    const auto t0 = Clock::now();
    detail::write_atomically(
        request.svg, [&](int fd, const std::string&) { run_dot(picture.source, fd, request.svg, picture, request.timeout); },
        [&](const std::string& what) { throw Error("--svg " + request.svg + ": " + what); });
    // One line: on stdout, unless stdout carries --dot's source or another view.
    const std::string line = "rendered " + request.svg + " in " + seconds_str(ms_since(t0)) + ": " +
                             picture.summary() + hints(picture) + "\n";
    (other_output || request.dot ? std::cerr : std::cout) << line;
  }
  if (request.dot) {
    std::cout << picture.source;
    if (request.svg.empty() && (picture.module_level() || picture.over_budget)) {
      std::cerr << "drew " << picture.summary() << " (" << hints(picture).substr(2) << ")\n";
    }
  }
}

}  // namespace torchcap::cli
