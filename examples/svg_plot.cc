#include "examples/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensor/base/error.h"

namespace tandem::examples {
namespace {

// Geometry, in SVG user units.
constexpr double kPanelWidth = 480;
constexpr double kHeight = 400;
constexpr double kOuterMargin = 10;
constexpr double kLeft = 70;  // inside a panel: room for the y tick labels and y label
constexpr double kRight = 20;
constexpr double kTop = 76;     // the chart's title and the panel's title
constexpr double kBottom = 56;  // x tick labels and x label

struct Range {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  void Add(double v) {
    if (!std::isfinite(v)) return;
    low = std::min(low, v);
    high = std::max(high, v);
  }
  bool empty() const { return low > high; }
};

std::string Number(double v) { return absl::StrFormat("%.2f", v); }

// A tick label with as few decimals as the step needs.
std::string TickLabel(double value, double step, bool percent) {
  if (percent) {
    value *= 100;
    step *= 100;
  }
  int decimals = 0;
  while (decimals < 6 && std::abs(step * std::pow(10.0, decimals) -
                                  std::round(step * std::pow(10.0, decimals))) > 1e-6) {
    ++decimals;
  }
  if (std::abs(value) < step * 1e-9) value = 0;  // no "-0"
  return absl::StrFormat("%.*f%s", decimals, value, percent ? "%" : "");
}

void RenderPanel(const PlotPanel& panel, const std::string& x_label, double x0, std::string& out) {
  const double left = x0 + kLeft, right = x0 + kPanelWidth - kRight;
  const double top = kTop, bottom = kHeight - kBottom;
  Range xr, yr;
  for (const PlotSeries& s : panel.series) {
    TANDEM_CHECK(s.x.size() == s.y.size(), "RenderSvgChart: series '", s.name, "' has ", s.x.size(),
                 " x values but ", s.y.size(), " y values; give one x per y");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        xr.Add(s.x[i]);
        yr.Add(s.y[i]);
      }
    }
  }
  if (xr.empty()) xr = {0, 1};
  if (yr.empty()) yr = {0, 1};
  if (xr.high - xr.low < 1e-12) xr = {xr.low - 0.5, xr.high + 0.5};
  if (yr.high - yr.low < 1e-12) {
    const double pad = std::max(std::abs(yr.low) * 0.05, 1e-3);
    yr = {yr.low - pad, yr.high + pad};
  }
  // x: whole steps when few (epochs), else nice ticks; y: nice ticks spanning the data.
  std::vector<double> xticks;
  const bool integral_x = std::floor(xr.low) == xr.low && std::floor(xr.high) == xr.high;
  if (integral_x && xr.high - xr.low <= 12) {
    for (double v = xr.low; v <= xr.high + 1e-9; v += 1) xticks.push_back(v);
  } else {
    xticks = NiceTicks(xr.low, xr.high, 8);
  }
  std::vector<double> yticks = NiceTicks(yr.low, yr.high, 6);
  const double x_low = std::min(xr.low, xticks.front()), x_high = std::max(xr.high, xticks.back());
  const double y_low = yticks.front(), y_high = yticks.back();
  const double x_pad = (x_high - x_low) * 0.03;
  auto px = [&](double v) {
    return left + (v - (x_low - x_pad)) / (x_high - x_low + 2 * x_pad) * (right - left);
  };
  auto py = [&](double v) { return bottom - (v - y_low) / (y_high - y_low) * (bottom - top); };
  const double y_step = yticks.size() > 1 ? yticks[1] - yticks[0] : 1.0;
  const double x_step = xticks.size() > 1 ? xticks[1] - xticks[0] : 1.0;

  absl::StrAppend(&out, "  <g class=\"panel\">\n");
  absl::StrAppendFormat(&out,
                        "    <text x=\"%s\" y=\"%s\" font-size=\"15\" font-weight=\"bold\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        Number((left + right) / 2), Number(top - 14), XmlEscape(panel.title));
  absl::StrAppendFormat(&out,
                        "    <rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#fbfbfb\" "
                        "stroke=\"#444\" stroke-width=\"1\"/>\n",
                        Number(left), Number(top), Number(right - left), Number(bottom - top));
  for (double t : yticks) {
    const double y = py(t);
    absl::StrAppendFormat(&out,
                          "    <line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#ddd\"/>\n",
                          Number(left), Number(y), Number(right), Number(y));
    absl::StrAppendFormat(&out,
                          "    <line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#444\"/>\n",
                          Number(left - 5), Number(y), Number(left), Number(y));
    absl::StrAppendFormat(&out,
                          "    <text x=\"%s\" y=\"%s\" font-size=\"12\" text-anchor=\"end\" "
                          "dominant-baseline=\"middle\">%s</text>\n",
                          Number(left - 8), Number(y), TickLabel(t, y_step, panel.percent));
  }
  for (double t : xticks) {
    const double x = px(t);
    absl::StrAppendFormat(&out,
                          "    <line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#444\"/>\n",
                          Number(x), Number(bottom), Number(x), Number(bottom + 5));
    absl::StrAppendFormat(&out,
                          "    <text x=\"%s\" y=\"%s\" font-size=\"12\" "
                          "text-anchor=\"middle\">%s</text>\n",
                          Number(x), Number(bottom + 20), TickLabel(t, x_step, false));
  }
  absl::StrAppendFormat(&out,
                        "    <text x=\"%s\" y=\"%s\" font-size=\"13\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        Number((left + right) / 2), Number(kHeight - 14), XmlEscape(x_label));
  const double label_x = x0 + 18, label_y = (top + bottom) / 2;
  absl::StrAppendFormat(&out,
                        "    <text x=\"%s\" y=\"%s\" font-size=\"13\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 %s %s)\">%s</text>\n",
                        Number(label_x), Number(label_y), Number(label_x), Number(label_y),
                        XmlEscape(panel.y_label));
  for (const PlotSeries& s : panel.series) {
    std::string points;
    std::string markers;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      absl::StrAppend(&points, points.empty() ? "" : " ", Number(px(s.x[i])), ",",
                      Number(py(s.y[i])));
      absl::StrAppendFormat(&markers, "      <circle cx=\"%s\" cy=\"%s\" r=\"3\"/>\n",
                            Number(px(s.x[i])), Number(py(s.y[i])));
    }
    absl::StrAppendFormat(&out, "    <g class=\"series\" fill=\"%s\">\n", XmlEscape(s.color));
    absl::StrAppendFormat(&out,
                          "      <polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                          "stroke-width=\"2\"%s/>\n",
                          points, XmlEscape(s.color), s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    absl::StrAppend(&out, markers, "    </g>\n");
  }
  // Legend, top right inside the plot area.
  if (!panel.series.empty()) {
    size_t longest = 0;
    for (const PlotSeries& s : panel.series) longest = std::max(longest, s.name.size());
    const double width = 44 + 7.5 * static_cast<double>(longest);
    const double height = 8 + 18 * static_cast<double>(panel.series.size());
    // The corner whose box covers the fewest points of the lines (sampled along each segment).
    std::vector<std::pair<double, double>> samples;
    for (const PlotSeries& s : panel.series) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
        samples.push_back({px(s.x[i]), py(s.y[i])});
        if (i + 1 < s.x.size() && std::isfinite(s.x[i + 1]) && std::isfinite(s.y[i + 1])) {
          for (int k = 1; k < 16; ++k) {
            const double f = k / 16.0;
            samples.push_back(
                {px(s.x[i] + f * (s.x[i + 1] - s.x[i])), py(s.y[i] + f * (s.y[i + 1] - s.y[i]))});
          }
        }
      }
    }
    double lx = right - width - 8, ly = top + 8;
    int best = -1;
    for (const auto& [cx, cy] : {std::pair<double, double>{right - width - 8, top + 8},
                                 {right - width - 8, bottom - height - 8},
                                 {left + 8, top + 8},
                                 {left + 8, bottom - height - 8}}) {
      int covered = 0;
      for (const auto& [x, y] : samples) {
        covered += x >= cx - 6 && x <= cx + width + 6 && y >= cy - 6 && y <= cy + height + 6;
      }
      if (best < 0 || covered < best) {
        best = covered;
        lx = cx;
        ly = cy;
      }
    }
    absl::StrAppendFormat(&out,
                          "    <g class=\"legend\">\n      <rect x=\"%s\" y=\"%s\" width=\"%s\" "
                          "height=\"%s\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#999\"/>\n",
                          Number(lx), Number(ly), Number(width), Number(height));
    for (size_t i = 0; i < panel.series.size(); ++i) {
      const PlotSeries& s = panel.series[i];
      const double y = ly + 13 + 18 * static_cast<double>(i);
      absl::StrAppendFormat(&out,
                            "      <line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"%s\" "
                            "stroke-width=\"2\"%s/>\n",
                            Number(lx + 6), Number(y), Number(lx + 32), Number(y),
                            XmlEscape(s.color), s.dashed ? " stroke-dasharray=\"6 4\"" : "");
      absl::StrAppendFormat(&out,
                            "      <text x=\"%s\" y=\"%s\" font-size=\"12\" "
                            "dominant-baseline=\"middle\">%s</text>\n",
                            Number(lx + 38), Number(y), XmlEscape(s.name));
    }
    absl::StrAppend(&out, "    </g>\n");
  }
  absl::StrAppend(&out, "  </g>\n");
}

}  // namespace

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> NiceTicks(double low, double high, int target) {
  TANDEM_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high && target >= 1,
               "NiceTicks: expected finite low <= high and target >= 1 but got [", low, ", ", high,
               "] and ", target);
  if (high - low < 1e-12) {
    const double pad = std::max(std::abs(low) * 0.05, 1e-3);
    low -= pad;
    high += pad;
  }
  const double raw = (high - low) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  // Ticks are k * step, rounded to the step's decimals so that they are the doubles nearest
  // to the round numbers they stand for (0.3, not 0.30000000000000004).
  const double scale = std::pow(10.0, std::max(0.0, -std::floor(std::log10(step))) + 1);
  const double first = std::floor(low / step + 1e-9);
  std::vector<double> ticks;
  for (int i = 0;; ++i) {
    const double t = std::round((first + i) * step * scale) / scale;
    ticks.push_back(t);
    if (t >= high - step * 1e-9) break;
  }
  return ticks;
}

std::string RenderSvgChart(const std::string& title, const std::string& x_label,
                           const std::vector<PlotPanel>& panels) {
  TANDEM_CHECK(!panels.empty(), "RenderSvgChart: expected at least one panel but got none");
  const double width = 2 * kOuterMargin + kPanelWidth * static_cast<double>(panels.size());
  std::string out;
  absl::StrAppendFormat(&out,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%s\" height=\"%s\" "
                        "viewBox=\"0 0 %s %s\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n",
                        Number(width), Number(kHeight), Number(width), Number(kHeight));
  absl::StrAppendFormat(&out, "  <title>%s</title>\n", XmlEscape(title));
  absl::StrAppendFormat(&out,
                        "  <rect x=\"0\" y=\"0\" width=\"%s\" height=\"%s\" fill=\"white\"/>\n",
                        Number(width), Number(kHeight));
  absl::StrAppendFormat(&out,
                        "  <text x=\"%s\" y=\"28\" font-size=\"18\" font-weight=\"bold\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        Number(width / 2), XmlEscape(title));
  for (size_t i = 0; i < panels.size(); ++i) {
    RenderPanel(panels[i], x_label, kOuterMargin + kPanelWidth * static_cast<double>(i), out);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace tandem::examples
