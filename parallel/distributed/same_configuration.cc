#include "parallel/distributed/same_configuration.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

namespace tandem::parallel::distributed {
namespace {

// "rank 1", "ranks 0, 2", "ranks 0-3, 5".
std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out << (i == 0 ? "" : ", ") << ranks[i];
    if (j > i + 1) {
      out << "-" << ranks[j];
    } else if (j == i + 1) {
      out << ", " << ranks[j];
    }
    i = j + 1;
  }
  return out.str();
}

std::string Shown(const std::optional<std::string>& value) {
  if (!value) return "no such setting";
  if (value->empty()) return "''";
  constexpr size_t kLongest = 80;
  return value->size() > kLongest ? value->substr(0, kLongest) + "..." : *value;
}

}  // namespace

void RequireSameConfiguration(ProcessGroup& group, const std::vector<Setting>& settings,
                              const std::string& how_to_fix) {
  // This rank's settings as one text: name, NUL, value, NUL, for each.
  std::string text;
  std::set<std::string> names;
  for (const Setting& s : settings) {
    TANDEM_CHECK(!s.name.empty(), "RequireSameConfiguration: a setting (value '", s.value,
                 "') has an empty name; give every setting a name");
    TANDEM_CHECK(names.insert(s.name).second, "RequireSameConfiguration: the setting '", s.name,
                 "' is given twice; give each setting once");
    TANDEM_CHECK(s.name.find('\0') == std::string::npos && s.value.find('\0') == std::string::npos,
                 "RequireSameConfiguration: the setting '", s.name,
                 "' holds a NUL character in its name or value; settings are text without NULs");
    text += s.name;
    text += '\0';
    text += s.value;
    text += '\0';
  }
  const int world = group.size();
  const Device device = group.device();
  Tensor length =
      from_vector(std::vector<int64_t>{static_cast<int64_t>(text.size())}, {1}).to(device);
  Tensor lengths = zeros({world}, TensorOptions(kInt64).device(device));
  group.allgather(lengths, length)->wait();
  const std::vector<int64_t> sizes = lengths.to_vector<int64_t>();
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  // The texts travel as int64 words (the group's dtypes), each padded to the longest.
  const int64_t words = (longest + 7) / 8;
  std::vector<int64_t> mine(static_cast<size_t>(words), 0);
  if (!text.empty()) std::memcpy(mine.data(), text.data(), text.size());
  Tensor all = zeros({world * words}, TensorOptions(kInt64).device(device));
  if (words > 0) group.allgather(all, from_vector(mine, {words}).to(device))->wait();
  const std::vector<int64_t> gathered = all.to_vector<int64_t>();

  // Every rank's settings, in the order of first appearance (this rank's first).
  std::vector<std::map<std::string, std::string>> by_rank(static_cast<size_t>(world));
  std::vector<std::string> order;
  std::set<std::string> seen;
  for (const Setting& s : settings) {
    order.push_back(s.name);
    seen.insert(s.name);
  }
  for (int r = 0; r < world; ++r) {
    const char* bytes = reinterpret_cast<const char*>(gathered.data() + r * words);
    const std::string theirs(bytes, static_cast<size_t>(sizes[r]));
    for (size_t at = 0; at < theirs.size();) {
      const size_t name_end = theirs.find('\0', at);
      const size_t value_end =
          name_end == std::string::npos ? std::string::npos : theirs.find('\0', name_end + 1);
      if (value_end == std::string::npos) break;  // not from this function: ignore the rest
      std::string name = theirs.substr(at, name_end - at);
      by_rank[r][name] = theirs.substr(name_end + 1, value_end - name_end - 1);
      if (seen.insert(name).second) order.push_back(name);
      at = value_end + 1;
    }
  }
  std::set<std::string> derived;
  for (const Setting& s : settings) {
    if (s.derived) derived.insert(s.name);
  }

  // What each differing setting is on each rank.
  std::vector<std::string> primary, secondary;
  for (const std::string& name : order) {
    std::vector<std::pair<std::optional<std::string>, std::vector<int>>> values;
    for (int r = 0; r < world; ++r) {
      auto found = by_rank[r].find(name);
      std::optional<std::string> value;
      if (found != by_rank[r].end()) value = found->second;
      auto same = std::find_if(values.begin(), values.end(),
                               [&](const auto& v) { return v.first == value; });
      if (same == values.end()) {
        values.push_back({value, {r}});
      } else {
        same->second.push_back(r);
      }
    }
    if (values.size() == 1) continue;
    constexpr size_t kMostValues = 6;
    std::ostringstream out;
    out << name << " (";
    for (size_t i = 0; i < values.size() && i < kMostValues; ++i) {
      out << (i == 0 ? "" : ", ") << Shown(values[i].first) << " on " << RankList(values[i].second);
    }
    if (values.size() > kMostValues) out << ", and " << values.size() - kMostValues << " more";
    out << ")";
    (derived.count(name) ? secondary : primary).push_back(out.str());
  }
  const std::vector<std::string>& report = primary.empty() ? secondary : primary;
  if (report.empty()) return;
  std::ostringstream message;
  message << "the " << world << " ranks disagree on ";
  for (size_t i = 0; i < report.size(); ++i) message << (i == 0 ? "" : "; ") << report[i];
  message << "; " << how_to_fix;
  throw ConfigurationMismatch(message.str());
}

}  // namespace tandem::parallel::distributed
