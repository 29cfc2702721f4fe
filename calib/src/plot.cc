#include "fsdplab/calib/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fsdplab/core/text_format.h"

namespace fsdplab::calib {
namespace {

constexpr double kWidth = 760;
constexpr double kPanelHeight = 410;
constexpr double kLeft = 80, kRight = 24, kTop = 40, kBottom = 75;
// Characters of 11-px sans-serif text that fit across the panel (about 6.6 px each).
constexpr std::size_t kLineChars = static_cast<std::size_t>((kWidth - kLeft) / 6.6);

std::string SizeLabel(double bytes) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:g}{}", bytes, units[u]);
}

double LogLo(const CollectiveFit& fit) {
  return std::log10(static_cast<double>(fit.curve.knots.front().bytes) / 4);
}
double LogHi(const CollectiveFit& fit) {
  return std::log10(static_cast<double>(fit.curve.knots.back().bytes) * 4);
}

std::string Panel(const CollectiveFit& fit, double y0) {
  const double x_lo = LogLo(fit);
  const double x_hi = LogHi(fit);
  double t_lo = 1e300, t_hi = 0;
  auto track = [&](double t) {
    if (t > 0) {
      t_lo = std::min(t_lo, t);
      t_hi = std::max(t_hi, t);
    }
  };
  for (const FitPoint& p : fit.points) track(p.measured_us);
  track(CurveTimeUs(fit.curve, static_cast<Bytes>(std::pow(10.0, x_hi)), fit.world_size));
  track(fit.curve.knots.front().time_us);
  const double y_lo = std::floor(std::log10(t_lo));
  const double y_hi = std::ceil(std::log10(t_hi));
  const double pw = kWidth - kLeft - kRight, ph = kPanelHeight - kTop - kBottom;
  auto px = [&](double bytes) { return kLeft + (std::log10(bytes) - x_lo) / (x_hi - x_lo) * pw; };
  auto py = [&](double us) {
    return y0 + kTop + ph - (std::log10(us) - y_lo) / std::max(1e-9, y_hi - y_lo) * ph;
  };
  std::string s;
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">{} {} ({} ranks): max "
      "|error| {:.1f}%, median {:.1f}% (one line: {:.1f}%, {:.1f}%)</text>\n",
      10, y0 + 22, CollectiveKindName(fit.collective), TierKindName(fit.tier), fit.world_size,
      fit.max_error_pct, fit.median_error_pct, fit.line_max_error_pct, fit.line_median_error_pct);
  s += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", kLeft,
      y0 + kTop, pw, ph);
  // Grid: decades of time, powers of 1024 of size.
  for (double e = y_lo; e <= y_hi + 1e-9; e += 1) {
    double y = py(std::pow(10.0, e));
    s += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/><text x=\"{}\" "
        "y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{:g} us</text>\n",
        kLeft, y, kLeft + pw, y, kLeft - 4, y + 4, std::pow(10.0, e));
  }
  for (double b = 1; b <= std::pow(10.0, x_hi); b *= 1024) {
    if (std::log10(b) < x_lo) continue;
    double x = px(b);
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/><text x=\"{:.1f}\" "
        "y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
        x, y0 + kTop, x, y0 + kTop + ph, x, y0 + kTop + ph + 15, SizeLabel(b));
  }
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">size (bytes)</text>\n",
      kLeft + pw / 2, y0 + kTop + ph + 32);
  // The curve: measured range solid, beyond it dashed; the single line dotted.
  auto polyline = [&](double from, double to, const char* style, auto time_of) {
    std::string pts;
    for (int i = 0; i <= 200; ++i) {
      double lb = from + (to - from) * i / 200.0;
      double b = std::pow(10.0, lb);
      double t = time_of(static_cast<Bytes>(std::max(1.0, b)));
      if (t > 0) pts += fmt::format("{:.1f},{:.1f} ", px(b), py(t));
    }
    return fmt::format("<polyline fill=\"none\" {} points=\"{}\"/>\n", style, pts);
  };
  auto curve = [&](Bytes b) { return CurveTimeUs(fit.curve, b, fit.world_size); };
  auto line = [&](Bytes b) { return RingTimeUs(fit.line, b, fit.world_size); };
  const double k_lo = std::log10(static_cast<double>(fit.curve.knots.front().bytes));
  const double k_hi = std::log10(static_cast<double>(fit.curve.knots.back().bytes));
  s += polyline(x_lo, x_hi, "stroke=\"#999\" stroke-dasharray=\"2,3\"", line);
  s +=
      polyline(x_lo, k_lo, "stroke=\"#1f77b4\" stroke-width=\"2\" stroke-dasharray=\"6,4\"", curve);
  s += polyline(k_lo, k_hi, "stroke=\"#1f77b4\" stroke-width=\"2\"", curve);
  s +=
      polyline(k_hi, x_hi, "stroke=\"#1f77b4\" stroke-width=\"2\" stroke-dasharray=\"6,4\"", curve);
  for (const FitPoint& p : fit.points) {
    s += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#d62728\"><title>{} B: measured {:.2f} "
        "us, fitted {:.2f} us ({:+.1f}%)</title></circle>\n",
        px(static_cast<double>(p.bytes)), py(p.measured_us), p.bytes, p.measured_us, p.fitted_us,
        p.error_pct);
  }
  // The point the curve misses most, labelled; below the axis, what is drawn and from where
  // (file names only, cut to the panel's width).
  if (!fit.points.empty()) {
    const FitPoint& worst = *std::max_element(
        fit.points.begin(), fit.points.end(), [](const FitPoint& a, const FitPoint& b) {
          return std::abs(a.error_pct) < std::abs(b.error_pct);
        });
    const double x = px(static_cast<double>(worst.bytes));
    const bool left = x > kLeft + pw / 2;
    s += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#d62728\" "
        "text-anchor=\"{}\">largest error {:+.1f}% at {}</text>\n",
        left ? x - 8 : x + 8, py(worst.measured_us) - 8, left ? "end" : "start", worst.error_pct,
        SizeLabel(static_cast<double>(worst.bytes)));
  }
  std::vector<std::string> files;
  for (const std::string& f : fit.sources) {
    files.push_back(
        f.substr(f.find_last_of('/') == std::string::npos ? 0 : f.find_last_of('/') + 1));
  }
  std::string from = fmt::format("from {}", fmt::join(files, ", "));
  if (from.size() > kLineChars) from = from.substr(0, kLineChars - 3) + "...";
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#555\">dots: measured; blue: the "
      "fitted curve (dashed: extrapolated); dotted: one alpha-beta line</text>\n"
      "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#555\">{}</text>\n",
      kLeft, y0 + kPanelHeight - 26, kLeft, y0 + kPanelHeight - 10, XmlEscape(from));
  return s;
}

}  // namespace

std::vector<Bytes> PlotSizes(const CollectiveFit& fit, int n) {
  std::vector<Bytes> out;
  if (fit.curve.empty() || n < 2) return out;
  const double lo = LogLo(fit), hi = LogHi(fit);
  for (int i = 0; i < n; ++i) {
    const auto b = static_cast<Bytes>(std::max(1.0, std::pow(10.0, lo + (hi - lo) * i / (n - 1))));
    if (out.empty() || b > out.back()) out.push_back(b);
  }
  return out;
}

std::string FitPlotSvg(const std::vector<CollectiveFit>& fits) {
  const double height = kPanelHeight * static_cast<double>(std::max<std::size_t>(1, fits.size()));
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, height, kWidth, height);
  for (std::size_t i = 0; i < fits.size(); ++i) {
    if (fits[i].curve.empty()) continue;
    s += Panel(fits[i], kPanelHeight * static_cast<double>(i));
  }
  s += "</svg>\n";
  return s;
}

}  // namespace fsdplab::calib
