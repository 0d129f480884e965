# Compiled only when Plug is available (ExBurn does not depend on it).
if Code.ensure_loaded?(Plug.Conn) do
  defmodule ExBurn.Server.Plug do
    @moduledoc """
    `ExBurn.Server`'s routes as a Plug, for applications that already run Cowboy or Bandit:
    start the server without its own listener and mount the plug.

        children = [
          {ExBurn.Server, port: false, name: MyApp.Inference},
          {Bandit, plug: {ExBurn.Server.Plug, server: MyApp.Inference}, port: 4000}
        ]

        # or in a Phoenix/Plug router
        forward "/", ExBurn.Server.Plug, server: MyApp.Inference

    The request path must be the server's own (`/v1/...`, `/api/v1/...`): mount it at the
    root, or let `forward` strip the prefix. Streams are sent with `Plug.Conn.chunk/2`; a
    failed chunk means the client went away and stops the generation. Bodies over the
    server's `:body_limit` get 413. Unlike the `:httpd` adapter, it cannot see a client hang
    up while its request is still queued (Plug has no such signal): that request runs when its
    turn comes and stops at its first chunk.

    Tested through `Plug.Test` (`test/ex_burn/server/plug_test.exs`, run where Plug is
    available), not under a live Cowboy or Bandit.
    """

    @behaviour Plug

    alias ExBurn.Server.{Handler, Instance, Request, Response}

    @impl true
    def init(opts), do: Keyword.get(opts, :server, ExBurn.Server)

    @impl true
    def call(conn, name) do
      limit =
        case Instance.config(name) do
          nil -> 4 * 1024 * 1024
          config -> config.body_limit
        end

      {body, conn} = read_body(conn, limit, 0, [])

      request = %Request{
        method: conn.method,
        path: conn.request_path,
        query: conn.query_string,
        headers: conn.req_headers,
        body: body,
        peer: conn.remote_ip |> :inet.ntoa() |> to_string()
      }

      Handler.serve(name, request, &send_response(conn, &1))
    end

    # The whole body, or :too_large once it passes the limit (the rest is not read).
    defp read_body(conn, limit, size, acc) do
      case Plug.Conn.read_body(conn, length: 1_048_576) do
        {status, data, conn} when status in [:ok, :more] ->
          size = size + byte_size(data)

          cond do
            size > limit -> {:too_large, conn}
            status == :ok -> {IO.iodata_to_binary([acc | data]), conn}
            true -> read_body(conn, limit, size, [acc | data])
          end

        {:error, _} ->
          {IO.iodata_to_binary(acc), conn}
      end
    end

    defp send_response(conn, %Response{status: status, headers: headers, body: {:stream, chunks}}) do
      conn = conn |> put_headers(headers) |> Plug.Conn.send_chunked(status)

      Enum.reduce_while(chunks, {:ok, conn}, fn chunk, {:ok, conn} ->
        case Plug.Conn.chunk(conn, chunk) do
          {:ok, conn} -> {:cont, {:ok, conn}}
          {:error, _} -> {:halt, {:closed, conn}}
        end
      end)
    end

    defp send_response(conn, %Response{status: status, headers: headers, body: body}) do
      {:ok, conn |> put_headers(headers) |> Plug.Conn.send_resp(status, body)}
    end

    defp put_headers(conn, headers) do
      Enum.reduce(headers, conn, fn {k, v}, conn -> Plug.Conn.put_resp_header(conn, k, v) end)
    end
  end
end
