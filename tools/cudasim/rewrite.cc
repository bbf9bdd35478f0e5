// The source-to-source step of a cudasim build: rewrites a .cu file so that g++ compiles it.
//
//   rewrite <input.cu> <output.cc> <name shown in messages>
//
// - `Kernel<<<grid, block, shmem, stream>>>(args)` becomes a call of ::cudasim::Launch (see
//   include/cudasim/launch.h) that names the kernel and the line in failure messages, and
//   passes the kernel's address where the callee names one function.
// - `extern __shared__ T name[];` (dynamic shared memory) becomes a pointer to the running
//   block's dynamic shared memory.
// - `__shared__ T name[N];` in a function is followed by a call that poisons it at the start of
//   each block (PoisonStaticShared).
// Line numbers are kept (#line and the same count of newlines), so compiler errors and
// messages point into the .cu file.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void Die(const std::string& where, const std::string& message) {
  std::cerr << where << ": cudasim rewrite: " << message << "\n";
  std::exit(1);
}

int LineAt(const std::string& text, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

// Marks each character that is code (not in a comment, string or character literal).
std::string CodeMask(const std::string& text) {
  std::string mask(text.size(), 'c');
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 2, "//") == 0) {
      while (i < text.size() && text[i] != '\n') mask[i++] = ' ';
    } else if (text.compare(i, 2, "/*") == 0) {
      size_t end = text.find("*/", i + 2);
      end = end == std::string::npos ? text.size() : end + 2;
      while (i < end) mask[i++] = ' ';
    } else if (text[i] == '"' || text[i] == '\'') {
      const char quote = text[i];
      mask[i++] = ' ';
      while (i < text.size() && text[i] != quote) {
        if (text[i] == '\\') mask[i++] = ' ';
        if (i < text.size()) mask[i++] = ' ';
      }
      if (i < text.size()) mask[i++] = ' ';
    } else {
      ++i;
    }
  }
  return mask;
}

std::string RewriteLaunches(const std::string& text, const std::string& name) {
  const std::string mask = CodeMask(text);
  std::string out;
  size_t copied = 0;
  size_t pos = 0;
  while ((pos = text.find("<<<", pos)) != std::string::npos) {
    if (mask[pos] != 'c') {
      pos += 3;
      continue;
    }
    const std::string where = name + ":" + std::to_string(LineAt(text, pos));
    // The callee: an identifier (with ::) and optional template arguments, just before.
    size_t start = pos;
    while (start > 0 && std::isspace(static_cast<unsigned char>(text[start - 1]))) --start;
    if (start > 0 && text[start - 1] == '>') {
      int depth = 0;
      do {
        --start;
        if (text[start] == '>') ++depth;
        if (text[start] == '<') --depth;
      } while (start > 0 && depth > 0);
      if (depth != 0) Die(where, "unbalanced template arguments before <<<");
    }
    while (start > 0 && (std::isalnum(static_cast<unsigned char>(text[start - 1])) ||
                         text[start - 1] == '_' || text[start - 1] == ':')) {
      --start;
    }
    if (start < copied) Die(where, "overlapping launches");
    const std::string callee = text.substr(start, pos - start);
    if (callee.empty()) Die(where, "no kernel name before <<<");
    const size_t config_end = text.find(">>>", pos + 3);
    if (config_end == std::string::npos) Die(where, "<<< without >>>");
    const std::string config = text.substr(pos + 3, config_end - pos - 3);
    size_t open = config_end + 3;
    while (open < text.size() && std::isspace(static_cast<unsigned char>(text[open]))) ++open;
    if (open >= text.size() || text[open] != '(') Die(where, "expected ( after >>>");
    int depth = 0;
    size_t close = open;
    for (; close < text.size(); ++close) {
      if (mask[close] != 'c') continue;
      if (text[close] == '(') ++depth;
      if (text[close] == ')' && --depth == 0) break;
    }
    if (close >= text.size()) Die(where, "unbalanced ( after >>>");
    std::string args = text.substr(open + 1, close - open - 1);
    const bool no_args = args.find_first_not_of(" \t\r\n") == std::string::npos;
    std::string label = callee;
    while (!label.empty() && std::isspace(static_cast<unsigned char>(label.back()))) {
      label.pop_back();
    }
    // The kernel's address for cudaFuncSetAttribute's per-kernel settings (see launch.h).
    const std::string address =
        "::cudasim::KernelAddress([](auto cudasim_probe) -> "
        "decltype(::cudasim::internal::KernelPointer(cudasim_probe, " +
        label + ")) { return " + label + "; })";
    std::string replacement = "::cudasim::Launch(::cudasim::LaunchConfig(" + config + "), \"" +
                              label + " (" + where + ")\", " + address +
                              ", [](auto... cudasim_args) { " + label + "(cudasim_args...); }" +
                              (no_args ? "" : ", " + args) + ")";
    // Keep the line count: the replacement holds the config's and args' newlines; the
    // original also had those between callee, <<<, >>> and (.
    const std::string original = text.substr(start, close + 1 - start);
    int missing = 0;
    for (char c : original) missing += c == '\n';
    for (char c : replacement) missing -= c == '\n';
    replacement.append(missing > 0 ? missing : 0, '\n');
    out += text.substr(copied, start - copied);
    out += replacement;
    copied = close + 1;
    pos = close + 1;
  }
  out += text.substr(copied);
  return out;
}

// After each `__shared__ T name...;` inside a function, a call that fills the variable with
// 0xff bytes (NaN, -1) when the running block first reaches it: shared memory is
// uninitialised at a block's start on a GPU, and a kernel that reads it before writing (a
// missing __syncthreads) must see garbage here too, not what the previous block left.
std::string PoisonStaticShared(const std::string& text) {
  const std::string mask = CodeMask(text);
  static const std::regex declaration(
      R"(\b__shared__\s+(?!extern)[^;{}()]*?\b([A-Za-z_]\w*)\s*(\[[^;{}]*\])?\s*;)");
  std::string out;
  size_t copied = 0;
  // Brace kinds: 'n' for namespace and extern "C" bodies, 'o' for the rest (functions, ...).
  std::string braces;
  size_t scanned = 0;
  auto scan_to = [&](size_t end) {
    for (; scanned < end; ++scanned) {
      if (mask[scanned] != 'c') continue;
      if (text[scanned] == '{') {
        size_t back = scanned;
        while (back > 0 && text[back - 1] != ';' && text[back - 1] != '}' &&
               text[back - 1] != '{') {
          --back;
        }
        const std::string head = text.substr(back, scanned - back);
        const bool ns = std::regex_search(head, std::regex(R"((^|\s)namespace\b|extern\s*"C)"));
        braces.push_back(ns ? 'n' : 'o');
      } else if (text[scanned] == '}' && !braces.empty()) {
        braces.pop_back();
      }
    }
  };
  for (std::sregex_iterator it(text.begin(), text.end(), declaration), end; it != end; ++it) {
    const size_t at = static_cast<size_t>(it->position(0));
    if (mask[at] != 'c') continue;
    if (text.compare(at > 7 ? at - 7 : 0, at > 7 ? 7 : at, "extern ") == 0) continue;
    scan_to(at);
    if (braces.empty() || braces.back() == 'n') continue;  // namespace scope: left alone
    const size_t stop = at + it->length(0);
    out += text.substr(copied, stop - copied);
    const std::string name = (*it)[1];
    out += " ::cudasim::internal::PoisonShared(&" + name + ", sizeof(" + name + "));";
    copied = stop;
  }
  out += text.substr(copied);
  return out;
}

std::string RewriteDynamicShared(const std::string& text) {
  static const std::regex pattern(
      R"(extern\s+__shared__\s+([^;\[]*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*;)");
  return std::regex_replace(
      text, pattern,
      "$1* const $2 = static_cast<$1*>(::cudasim::internal::tls_context.dynamic_shared);");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: rewrite <input.cu> <output.cc> <name in messages>\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) Die(argv[1], "cannot read it");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text =
      RewriteDynamicShared(PoisonStaticShared(RewriteLaunches(buffer.str(), argv[3])));
  std::ofstream out(argv[2], std::ios::binary);
  out << "#line 1 \"" << argv[3] << "\"\n" << text;
  if (!out) Die(argv[2], "cannot write it");
  return 0;
}
