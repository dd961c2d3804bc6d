-- wrk script: POST the echo tool's arguments to mcpo's /echo endpoint, and
-- print a machine-readable summary line (read by run.sh) when done.
wrk.method = "POST"
wrk.body = '{"message":"hello"}'
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_SUMMARY {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99)))
end
