# Compiled only where Nx is present (Nx calls would warn as undefined); the :nx tag keeps it
# out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.DistributedTest do
    # Starts distribution on this node and a peer node: not async, and cleaned up on exit.
    use ExUnit.Case, async: false
    import ExBurn.TestHelpers, only: [wait_until: 1, product_tolerance: 1]
    @moduletag :nx
    @moduletag :distributed

    alias ExBurn.Model

    @name :ex_burn_distributed_serving

    @peer_helper """
    defmodule ExBurn.Serving.PeerHelper do
      # NIF resources do not cross nodes: the model is compiled and kept on the peer.
      def start_serving(spec, name) do
        model = ExBurn.Model.compile(spec, seed: 11)
        :persistent_term.put({__MODULE__, name}, model)
        {:ok, sup} = DynamicSupervisor.start_link(strategy: :one_for_one)
        # Outlives the erpc call that started it (the peer itself is stopped by on_exit).
        Process.unlink(sup)
        {:ok, _} = ExBurn.Serving.supervise(model, name: name, supervisor: sup, batch_size: 8, batch_timeout: 5)
        :ok
      end

      def predict(name, inputs) do
        :persistent_term.get({__MODULE__, name}) |> ExBurn.Model.predict(inputs) |> ExBurn.Tensor.to_flat_list()
      end
    end
    """

    setup_all do
      started_dist? = start_distribution!()
      {:ok, peer, node} = start_peer!()

      on_exit(fn ->
        :peer.stop(peer)
        if started_dist?, do: Node.stop()
      end)

      %{node: node}
    end

    test "batched_run from this node is served by a serving on a peer node", %{node: node} do
      # The model and serving live on the peer; nothing by that name runs here.
      spec = Model.input({nil, 4}) |> Model.dense(8, activation: :tanh) |> Model.dense(2)
      :ok = :erpc.call(node, ExBurn.Serving.PeerHelper, :start_serving, [spec, @name])

      assert Process.whereis(@name) == nil
      wait_until(fn -> :pg.get_members(Nx.Serving.PG, @name) != [] end)

      inputs = for i <- 1..64, do: [i / 64, -i / 32, 1.0, rem(i, 3) * 1.0]

      expected =
        node |> :erpc.call(ExBurn.Serving.PeerHelper, :predict, [@name, inputs]) |> Enum.chunk_every(2)

      results =
        inputs
        |> Enum.map(fn x -> Task.async(fn -> ExBurn.Serving.batched_run(@name, Nx.tensor(x)) end) end)
        |> Enum.map(&Task.await(&1, 30_000))

      for {row, exp} <- Enum.zip(results, expected) do
        # Replies crossed the node boundary as host tensors.
        assert row.data.__struct__ == Nx.BinaryBackend
        assert Nx.shape(row) == {2}

        for {g, e} <- Enum.zip(Nx.to_flat_list(row), exp),
            do: assert_in_delta(g, e, product_tolerance(1.0e-5))
      end
    end

    defp start_distribution! do
      if Node.alive?() do
        false
      else
        # Loopback only; epmd must run before net_kernel starts.
        {_, 0} = System.cmd(epmd!(), ["-daemon"])
        {:ok, _} = Node.start(:"ex_burn_serving_test@127.0.0.1", :longnames)
        true
      end
    end

    defp epmd! do
      System.find_executable("epmd") ||
        Path.wildcard(Path.join(:code.root_dir(), "erts-*/bin/epmd")) |> List.first() ||
        flunk("epmd not found")
    end

    defp start_peer! do
      name = :"ex_burn_serving_peer_#{System.unique_integer([:positive])}"
      {:ok, peer, node} = :peer.start(%{name: name, host: ~c"127.0.0.1", longnames: true})
      :ok = :erpc.call(node, :code, :add_pathsa, [:code.get_path()])

      for app <- [:elixir, :logger, :nx, :ex_burn],
          do: {:ok, _} = :erpc.call(node, :application, :ensure_all_started, [app])

      # Anonymous functions from this (in-memory) test module cannot run on the peer: the code it
      # needs there is a small module whose object code is loaded into the peer.
      [{mod, bin}] = Code.compile_string(@peer_helper)
      {:module, ^mod} = :erpc.call(node, :code, :load_binary, [mod, ~c"peer_helper.ex", bin])
      {:ok, peer, node}
    end
  end
end
