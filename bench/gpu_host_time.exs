# Host time of one op through the NIF, with tensors too small for the device's time to matter:
# what every op pays before its kernel can start. CPU rows are the reference (in place up to
# 4096 elements, on a dirty scheduler above).
#
#     mix run bench/gpu_host_time.exs [DEVICE]
alias ExBurn.Tensor, as: T

device = ExBurn.Device.resolve(List.first(System.argv()) || "cuda")

per_call = fn label, n, f ->
  # Enum.each drops each result at once (a `for` would keep all of them alive in its list)
  Enum.each(1..200, fn _ -> f.() end)
  {us, _} = :timer.tc(fn -> Enum.each(1..n, fn _ -> f.() end) end)
  IO.puts("HOST device=#{label} us_per_call=#{Float.round(us / n, 2)}")
end

cpu = ExBurn.Device.resolve("cpu")

for {dev, n} <- [{cpu, 16}, {cpu, 8192}, {device, 16}] do
  a = T.iota({n}, :f32, device: dev)
  b = T.ones({n}, :f32, device: dev)
  tag = "#{ExBurn.Device.format(dev)} n=#{n}"
  per_call.("#{tag} case=add_issue", 5000, fn -> T.add(a, b) end)
  # a chain: each add depends on the previous one, its first element read every 8 adds
  per_call.("#{tag} case=add_chain_read8", 2000, fn ->
    Enum.reduce(1..8, a, fn _, acc -> T.add(acc, b) end) |> T.to_binary(1)
  end)

  per_call.("#{tag} case=add_read", 2000, fn -> T.add(a, b) |> T.to_binary(1) end)
  per_call.("#{tag} case=read", 2000, fn -> T.to_binary(a, 1) end)
end
