-- wrk's done() hook for release_tests.http_bench: its latency histogram as percentiles,
-- one "PERCENTILE <p> <microseconds>" line each (wrk --latency prints only 50/75/90/99),
-- so the summary can carry p99.9 and a downsampled CDF.
done = function(summary, latency, requests)
  local points = {1, 5, 10, 20, 30, 40, 50, 60, 70, 75, 80, 90, 95, 97.5, 99, 99.5, 99.9, 99.99}
  for _, p in ipairs(points) do
    io.write(string.format("PERCENTILE %g %d\n", p, latency:percentile(p)))
  end
  io.write(string.format("PERCENTILE 100 %d\n", latency.max))
end
