// Testbench wrapper (not generated): link_tx -> link_emulator -> link_rx, one direction of
// an inter-board link with its credit return path, for test_link.py and bench_rtl.py.
`default_nettype none
module link_chain #(
    parameter integer DATA_W = 64,
    parameter integer BEAT_BYTES = 8,
    parameter integer BW_NUM = 8,
    parameter integer BW_DEN = 1,
    parameter integer LATENCY = 16,
    parameter integer PTR_W = 4,
    parameter integer TOKEN_W = 8,
    parameter integer CREDITS = 64,
    parameter integer CREDIT_W = 7,
    parameter integer ADDR_W = 6
) (
    input  wire              clk,
    input  wire              rst,
    input  wire [DATA_W-1:0] s_axis_tdata,
    input  wire              s_axis_tvalid,
    output wire              s_axis_tready,
    output wire [DATA_W-1:0] m_axis_tdata,
    output wire              m_axis_tvalid,
    input  wire              m_axis_tready,
    output wire              link_tvalid,
    output wire              overflow
);
    wire [DATA_W-1:0] tx_tdata;
    wire tx_tvalid;
    wire tx_tready;
    wire [DATA_W-1:0] rx_tdata;
    wire rx_tvalid;
    wire rx_tready;
    wire credit_back;
    wire credit_fwd;
    wire emu_overflow;
    wire rx_overflow;

    assign link_tvalid = tx_tvalid && tx_tready;
    assign overflow = emu_overflow | rx_overflow;

    link_tx #(.DATA_W(DATA_W), .CREDITS(CREDITS), .CREDIT_W(CREDIT_W)) u_tx (
        .clk(clk), .rst(rst),
        .s_axis_tdata(s_axis_tdata), .s_axis_tvalid(s_axis_tvalid), .s_axis_tready(s_axis_tready),
        .m_axis_tdata(tx_tdata), .m_axis_tvalid(tx_tvalid), .m_axis_tready(tx_tready),
        .s_axis_credit_tvalid(credit_back));

    link_emulator #(.DATA_W(DATA_W), .BEAT_BYTES(BEAT_BYTES), .BW_NUM(BW_NUM), .BW_DEN(BW_DEN),
                    .LATENCY(LATENCY), .PTR_W(PTR_W), .TOKEN_W(TOKEN_W)) u_emu (
        .clk(clk), .rst(rst),
        .s_axis_tdata(tx_tdata), .s_axis_tvalid(tx_tvalid), .s_axis_tready(tx_tready),
        .m_axis_tdata(rx_tdata), .m_axis_tvalid(rx_tvalid), .m_axis_tready(rx_tready),
        .s_axis_rev_tvalid(credit_fwd), .m_axis_rev_tvalid(credit_back), .overflow(emu_overflow));

    link_rx #(.DATA_W(DATA_W), .DEPTH(CREDITS), .ADDR_W(ADDR_W), .COUNT_W(CREDIT_W)) u_rx (
        .clk(clk), .rst(rst),
        .s_axis_tdata(rx_tdata), .s_axis_tvalid(rx_tvalid), .s_axis_tready(rx_tready),
        .m_axis_tdata(m_axis_tdata), .m_axis_tvalid(m_axis_tvalid), .m_axis_tready(m_axis_tready),
        .m_axis_credit_tvalid(credit_fwd), .overflow(rx_overflow));
endmodule
`default_nettype wire
