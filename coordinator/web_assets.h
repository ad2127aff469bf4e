// The web view's files (coordinator/web/: index.html, app.css, app.js),
// compiled into the coordinator by the genrule in coordinator/BUILD.bazel:
// nothing is read from disk or fetched from elsewhere at run time.
#ifndef PTC_COORDINATOR_WEB_ASSETS_H_
#define PTC_COORDINATOR_WEB_ASSETS_H_

#include "absl/strings/string_view.h"

namespace ptc {

struct WebAsset {
  const char* path;  // "/index.html"
  const char* type;  // its Content-Type
  absl::string_view body;
};
extern const WebAsset kWebAssets[];
extern const int kWebAssetCount;

}  // namespace ptc

#endif  // PTC_COORDINATOR_WEB_ASSETS_H_
