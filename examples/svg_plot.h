// Line charts as self-contained SVG files, for the trainer's --plot: one or more panels side
// by side under a title, each with axes, tick labels, grid lines, a legend and one polyline
// (with point markers) per series. No fonts or scripts to fetch: a browser opens it as is.
//
//   examples::PlotPanel loss{"Loss", "cross-entropy", {
//       {"train", {1, 2, 3}, {0.52, 0.36, 0.32}, "#1f77b4"},
//       {"test", {1, 2, 3}, {0.43, 0.39, 0.37}, "#ff7f0e", /*dashed=*/true}}};
//   std::string svg = examples::RenderSvgChart("mlp on cpu:0, cpu:1", "epoch", {loss});
#ifndef TANDEM_EXAMPLES_SVG_PLOT_H_
#define TANDEM_EXAMPLES_SVG_PLOT_H_

#include <string>
#include <vector>

namespace tandem::examples {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // the same length; non-finite points are skipped
  std::string color = "#1f77b4";
  bool dashed = false;
};

struct PlotPanel {
  std::string title;
  std::string y_label;
  std::vector<PlotSeries> series;
  bool percent = false;  // y values are fractions, labelled as percentages
};

// An SVG document (UTF-8 text) with the panels side by side, `title` on top and `x_label`
// under every panel's x axis. Throws tandem::Error for no panels or series whose x and y
// differ in length.
std::string RenderSvgChart(const std::string& title, const std::string& x_label,
                           const std::vector<PlotPanel>& panels);

// About `target` round tick values (steps of 1, 2 or 5 times a power of ten) covering
// [low, high]: the first is <= low, the last >= high.
std::vector<double> NiceTicks(double low, double high, int target);

// `text` with &, <, >, " and ' escaped for XML.
std::string XmlEscape(const std::string& text);

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_SVG_PLOT_H_
