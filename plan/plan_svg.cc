#include "plan/plan_svg.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plan/plan_flows.h"

namespace ptc {
namespace {

// The matrix has at most this many rows and columns of hosts.
constexpr int kMaxCells = 48;
// Ranks drawn in each placement strip at most.
constexpr int kMaxRanksDrawn = 2048;

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", b)
                : absl::StrFormat("%.*f %s",
                                  b < 10    ? 2
                                  : b < 100 ? 1
                                            : 0,
                                  b, units[u]);
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
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
      default:
        out += c;
    }
  }
  return out;
}

// A host's colour: hues spread by the golden angle.
std::string HostColour(int host) {
  return absl::StrFormat("hsl(%d,55%%,62%%)",
                         static_cast<int>(std::fmod(host * 137.508, 360.0)));
}

// Bytes between hosts, and what stays on each, from the plan's pieces.
struct Flows {
  int hosts = 0;
  // [source][target]; source index `hosts` is the snapshot.
  std::vector<std::vector<double>> bytes;
  std::vector<double> kept, copied, sent, received;
};

Flows Measure(const PlanInput& input, const Plan& plan) {
  Flows f;
  f.hosts = static_cast<int>(input.cluster->hosts.size());
  f.bytes.assign(f.hosts + 1, std::vector<double>(f.hosts, 0.0));
  f.kept.assign(f.hosts, 0);
  f.copied.assign(f.hosts, 0);
  f.sent.assign(f.hosts + 1, 0);
  f.received.assign(f.hosts, 0);
  for (const HostFragment& frag : plan.fragments) {
    if (frag.host < 0 || frag.host >= f.hosts) continue;
    for (const HeldRegion& h : frag.holds) {
      if (h.kept_in_place) {
        f.kept[frag.host] += static_cast<double>(h.region.volume()) *
                             ElementSize(input.spec->tensors[h.tensor].dtype);
      }
    }
  }
  for (const HostFlow& flow : HostFlows(input, plan)) {
    const int src = flow.from == kFromSnapshot ? f.hosts : flow.from;
    if (src < 0 || src > f.hosts || flow.to < 0 || flow.to >= f.hosts) continue;
    const double b = static_cast<double>(flow.bytes);
    f.bytes[src][flow.to] += b;
    if (src == flow.to) {
      f.copied[src] += b;
    } else {
      f.sent[src] += b;
      f.received[flow.to] += b;
    }
  }
  return f;
}

// Consecutive hosts folded into at most kMaxCells groups.
struct Groups {
  int count = 0;
  std::vector<int> of;                    // host -> group
  std::vector<std::pair<int, int>> span;  // group -> [first, last] host
};

Groups GroupHosts(int hosts) {
  Groups g;
  g.count = std::min(hosts, kMaxCells);
  g.of.resize(hosts);
  g.span.assign(g.count, {hosts, -1});
  for (int h = 0; h < hosts; ++h) {
    const int i = static_cast<int>(static_cast<int64_t>(h) * g.count / hosts);
    g.of[h] = i;
    g.span[i].first = std::min(g.span[i].first, h);
    g.span[i].second = std::max(g.span[i].second, h);
  }
  return g;
}

std::string GroupName(const PlanInput& input, const Groups& g, int i) {
  const Cluster& cluster = *input.cluster;
  const auto [a, b] = g.span[i];
  int dead = 0;
  for (int h = a; h <= b; ++h) dead += input.IsAlive(h) ? 0 : 1;
  const std::string name =
      a == b ? cluster.hosts[a].name
             : absl::StrCat(cluster.hosts[a].name, "..", cluster.hosts[b].name);
  if (dead == 0) return name;
  return a == b ? absl::StrCat(name, " (dead)")
                : absl::StrCat(name, " (", dead, " dead)");
}

class Svg {
 public:
  void Text(double x, double y, const std::string& s, const char* cls = "",
            const char* anchor = "start") {
    absl::StrAppendFormat(&body_,
                          "<text x=\"%.1f\" y=\"%.1f\" class=\"%s\" "
                          "text-anchor=\"%s\">%s</text>\n",
                          x, y, cls, anchor, Escape(s));
  }
  // `data`: attributes for machines (data-bytes="..."), or empty.
  void Rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& tip = "", const std::string& data = "") {
    absl::StrAppendFormat(&body_,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                          "height=\"%.1f\" fill=\"%s\" stroke=\"#fff\" "
                          "stroke-width=\"0.5\"%s%s>",
                          x, y, w, h, fill, data.empty() ? "" : " ", data);
    if (!tip.empty())
      absl::StrAppend(&body_, "<title>", Escape(tip), "</title>");
    absl::StrAppend(&body_, "</rect>\n");
  }
  std::string Finish(double width, double height) const {
    return absl::StrCat(
        absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" "
                        "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
                        "%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
                        width, height, width, height),
        "<style>.title{font-size:15px;font-weight:bold}"
        ".head{font-size:12px;font-weight:bold}.small{font-size:9px}"
        ".cell{font-size:9px;fill:#111}.light{fill:#fff}.dim{fill:#666}</"
        "style>\n",
        "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n", body_,
        "</svg>\n");
  }

 private:
  std::string body_;
};

// Placement strips: one cell per rank, coloured by its host.
double DrawPlacement(Svg& svg, double y, const char* label,
                     const Placement* placement, const Cluster& cluster,
                     double width) {
  if (placement == nullptr || placement->world_size() == 0) return y;
  const int ranks = placement->world_size();
  svg.Text(20, y + 12,
           absl::StrCat(label, ": ", ranks, " ranks on their hosts"), "head");
  y += 20;
  if (ranks > kMaxRanksDrawn) {
    svg.Text(20, y + 10,
             absl::StrCat("(", ranks, " ranks: more than ", kMaxRanksDrawn,
                          " are not drawn)"),
             "dim");
    return y + 20;
  }
  const int per_row = std::min(ranks, 64);
  const double cell = std::min(18.0, (width - 40) / per_row);
  for (int r = 0; r < ranks; ++r) {
    const int h = placement->host[r];
    const double x = 20 + (r % per_row) * cell;
    const double yy = y + (r / per_row) * (cell + 2);
    const std::string name =
        h >= 0 && h < static_cast<int>(cluster.hosts.size())
            ? cluster.hosts[h].name
            : "?";
    svg.Rect(
        x, yy, cell - 1, cell, HostColour(h),
        absl::StrCat("rank ", r, " on ", name, " GPU ",
                     r < static_cast<int>(placement->device.size())
                         ? placement->device[r]
                         : -1),
        absl::StrFormat("class=\"rank %s\" data-rank=\"%d\" data-host=\"%d\"",
                        label, r, h));
    const std::string number = absl::StrCat(r);
    if (5.5 * number.size() + 2 <= cell)
      svg.Text(x + cell / 2, yy + cell * 0.7, number, "small", "middle");
  }
  return y + ((ranks + per_row - 1) / per_row) * (cell + 2) + 10;
}

}  // namespace

std::string PlanSvg(const PlanInput& input, const Plan& plan,
                    const std::string& title) {
  const Cluster& cluster = *input.cluster;
  const Flows f = Measure(input, plan);
  const Groups g = GroupHosts(f.hosts);
  const bool snapshot = f.sent[f.hosts] > 0;
  // Grouped matrix: rows are senders (and the snapshot), columns receivers.
  std::vector<std::vector<double>> m(g.count + 1,
                                     std::vector<double>(g.count, 0.0));
  double peak = 0;
  for (int s = 0; s <= f.hosts; ++s) {
    const int gs = s == f.hosts ? g.count : g.of[s];
    for (int t = 0; t < f.hosts; ++t) m[gs][g.of[t]] += f.bytes[s][t];
  }
  for (int t = 0; t < f.hosts; ++t) m[g.of[t]][g.of[t]] += f.kept[t];
  for (const auto& row : m)
    for (double b : row) peak = std::max(peak, b);

  const double cell = g.count <= 8 ? 56 : g.count <= 16 ? 36 : 16;
  const double left = 150, top = 110;
  const double width =
      std::max({620.0, left + g.count * cell + 140, 40 + 8.5 * title.size()});
  Svg svg;
  const PlanSummary& s = plan.summary;
  svg.Text(20, 26, title, "title");
  svg.Text(
      20, 48,
      absl::StrCat("across hosts ", Bytes(s.cross_host_bytes),
                   " (least possible ", Bytes(s.cross_host_bytes_lower_bound),
                   "); copied within hosts ", Bytes(s.copied_within_host_bytes),
                   "; kept in place ", Bytes(s.kept_in_place_bytes)));
  svg.Text(20, 66,
           absl::StrCat("busiest sender ", Bytes(s.max_host_send_bytes),
                        " (bound ", Bytes(s.max_host_send_bytes_lower_bound),
                        "); ", s.transfers, " pieces",
                        snapshot ? absl::StrCat("; from the snapshot ",
                                                Bytes(f.sent[f.hosts]))
                                 : ""));
  svg.Text(
      20, 92,
      g.count < f.hosts
          ? absl::StrCat("bytes from (rows) to (columns), ", f.hosts,
                         " hosts in ", g.count, " groups")
          : "bytes from (rows) to (columns); the diagonal stays on its host",
      "head");
  // Lightness of a cell: a log scale from 1 KiB to the largest cell.
  auto lightness = [&](double b) {
    const double lo = std::log(1024.0), hi = std::log(std::max(peak, 2048.0));
    const double t =
        std::clamp((std::log(std::max(b, 1024.0)) - lo) / (hi - lo), 0.0, 1.0);
    return static_cast<int>(92 - 60 * t);
  };
  auto shade = [&](double b, bool diagonal) -> std::string {
    if (b <= 0) return "#f4f4f4";
    return diagonal ? absl::StrFormat("hsl(140,45%%,%d%%)", lightness(b))
                    : absl::StrFormat("hsl(215,70%%,%d%%)", lightness(b));
  };
  const double legend = left + g.count * cell + 16;
  svg.Rect(legend, top, 10, 10, "hsl(215,70%,45%)");
  svg.Text(legend + 14, top + 9, "sent between hosts", "small");
  svg.Rect(legend, top + 16, 10, 10, "hsl(140,45%,45%)");
  svg.Text(legend + 14, top + 25, "stays on its host", "small");
  const int rows = g.count + (snapshot ? 1 : 0);
  for (int c = 0; c < g.count; ++c) {
    const double x = left + c * cell + cell / 2;
    if (cell >= 30) {
      svg.Text(x, top - 6, GroupName(input, g, c), "small", "middle");
    } else if (c % 4 == 0) {
      svg.Text(x, top - 6, absl::StrCat(g.span[c].first), "small", "middle");
    }
  }
  for (int r = 0; r < rows; ++r) {
    const bool snap_row = r == g.count;
    const double y = top + r * cell;
    if (cell >= 16 || r % 4 == 0 || snap_row) {
      svg.Text(left - 6, y + cell * 0.62,
               snap_row ? "snapshot" : GroupName(input, g, r), "small", "end");
    }
    for (int c = 0; c < g.count; ++c) {
      const double b = m[r][c];
      const bool diagonal = r == c;
      const std::string from =
          snap_row ? "the snapshot" : GroupName(input, g, r);
      svg.Rect(left + c * cell, y, cell, cell, shade(b, diagonal),
               absl::StrCat(from, " -> ", GroupName(input, g, c), ": ",
                            Bytes(b), diagonal ? " (stays on the host)" : ""),
               absl::StrFormat("class=\"flow\" data-from=\"%s\" data-to=\"%d\" "
                               "data-bytes=\"%.0f\"",
                               snap_row ? "snapshot" : absl::StrCat(r), c, b));
      if (b > 0 && cell >= 36)
        svg.Text(left + c * cell + cell / 2, y + cell * 0.58, Bytes(b),
                 lightness(b) < 55 ? "cell light" : "cell", "middle");
    }
  }
  double y = top + rows * cell + 24;
  y = DrawPlacement(svg, y, "source", input.source_placement, cluster, width);
  y = DrawPlacement(svg, y, "target", input.target_placement, cluster, width);
  return svg.Finish(width, y + 10);
}

std::string PlanHtml(const PlanInput& input, const Plan& plan,
                     const std::string& title) {
  const Flows f = Measure(input, plan);
  std::string rows;
  for (int h = 0; h < f.hosts && h < 4096; ++h) {
    if (f.sent[h] == 0 && f.received[h] == 0 && f.kept[h] == 0 &&
        f.copied[h] == 0)
      continue;
    absl::StrAppendFormat(
        &rows,
        "<tr><td><span class=\"sw\" style=\"background:%s\"></span>%s</td>"
        "<td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
        HostColour(h), Escape(input.cluster->hosts[h].name), Bytes(f.sent[h]),
        Bytes(f.received[h]), Bytes(f.copied[h]), Bytes(f.kept[h]));
  }
  return absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>",
      Escape(title),
      "</title>\n<style>body{font-family:sans-serif;margin:20px;color:#222}"
      "table{border-collapse:collapse;margin-top:16px}"
      "td,th{border:1px solid #ddd;padding:3px 10px;text-align:right}"
      "td:first-child,th:first-child{text-align:left}"
      ".sw{display:inline-block;width:10px;height:10px;margin-right:6px}"
      "</style></head><body>\n",
      PlanSvg(input, plan, title),
      "<table id=\"hosts\"><tr><th>host</th><th>sends</th><th>receives</th>"
      "<th>copies within</th><th>keeps in place</th></tr>\n",
      rows, "</table>\n</body></html>\n");
}

}  // namespace ptc
