// An SVG picture of calibration fits: per collective and tier, the measured times and the fitted
// cost curve against the size, on log-log axes (`fsdplab calibrate --plot FILE.svg`).
//
//   std::string svg = FitPlotSvg(fits);   // one panel per fit, stacked
//   WriteFileAtomic("fit.svg", svg);
#pragma once

#include <string>
#include <vector>

#include "fsdplab/calib/calibration.h"

namespace fsdplab::calib {

// The sizes a fit is drawn over, `n` of them evenly spaced on a log scale from a quarter of the
// curve's first knot to four times its last (the SVG's panels and the report page's plots).
std::vector<Bytes> PlotSizes(const CollectiveFit& fit, int n);

// Each panel: measured sizes as dots, the curve as a line from a quarter of the smallest size to
// four times the largest (the extrapolated parts dashed), the single alpha-beta line dotted,
// decade grid lines, and a title with the fit's errors.
std::string FitPlotSvg(const std::vector<CollectiveFit>& fits);

}  // namespace fsdplab::calib
