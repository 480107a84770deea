-- wrk script of bench/views.py: GET the paths of a file (one a line) in turn, each
-- connection's thread from its own offset so that the keys are spread over the key set,
-- and print the figures as one JSON line, prefixed "wrk-json ", when the run is done.
--   wrk -t1 -c8 -d3s -s bench/views.lua http://127.0.0.1:PORT -- PATHS_FILE
-- Requests are formatted once (init), so the client does no work per request beyond
-- wrk's own. Latencies are wrk's (microseconds: sent to whole answer read).

local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  local requests = {}
  for path in io.lines(args[1]) do
    if path ~= "" then
      requests[#requests + 1] = wrk.format("GET", path)
    end
  end
  assert(#requests > 0, "no paths in " .. args[1])
  -- each thread starts at its own place in the key set
  local first = (id * 7919) % #requests
  local i = first
  request = function()
    i = i % #requests + 1
    return requests[i]
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    'wrk-json {"requests":%d,"seconds":%.6f,"rps":%.1f,' ..
      '"p50_ms":%.4f,"p90_ms":%.4f,"p99_ms":%.4f,"max_ms":%.4f,"mean_ms":%.4f,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\n',
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000,
    e.connect, e.read, e.write, e.status, e.timeout))
end
